"""Authentication on a real server over TLS: agents by client certificate (mutual TLS), users
by bearer token; health checking is open; everything else is UNAUTHENTICATED without them. An
agent obeys only a server whose certificate its CA signed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from arranger.agent.agent import Agent
from arranger.agent.config import AgentConfig
from arranger.certs import make_certificates
from arranger.client.cli import main
from arranger.client.sdk import ArrangerError, AsyncClient
from arranger.security import TlsFiles, channel_credentials
from arranger.server.app import ArrangerServer
from arranger.server.config import ServerConfig
from arranger.v1 import agent_pb2, agent_pb2_grpc
from tests.conftest import FAST, NODE, eventually, job_spec, printed, script


@dataclasses.dataclass
class Secured:
    address: str  # the API port (TLS, tokens)
    agents: str  # the agent port (mutual TLS)
    tls: Path  # ca.pem, server.*, secure-0.* (the agent), and a stranger CA's files
    data_dir: Path
    token: str
    web: str = ""  # the dashboard's port (plain HTTP)
    server: ArrangerServer | None = None  # the server itself (in this process)


def run_cli(*argv: str) -> int:
    return main(list(argv))


@contextlib.asynccontextmanager
async def secured(
    tmp_path: Path, base: ServerConfig = FAST, **changes: Any
) -> AsyncIterator[Secured]:
    """secured: a server on `base`'s settings with `changes`, TLS and tokens, and no agents."""
    tls = tmp_path / "tls"
    assert (
        run_cli("certs", "--out", str(tls), "--server-host", "127.0.0.1", "--agent", "secure-0")
        == 0
    )
    make_certificates(tmp_path / "stranger", ["127.0.0.1"], ["secure-0"])  # another cluster's CA
    data = tmp_path / "server"
    config = dataclasses.replace(
        base,
        listen="127.0.0.1:0",
        data_dir=data,
        tls=TlsFiles(tls / "ca.pem", tls / "server.pem", tls / "server.key"),
        **changes,
    )
    server = ArrangerServer(config)
    await server.start()
    try:
        yield Secured(
            f"127.0.0.1:{server.port}",
            f"127.0.0.1:{server.agent_port}",
            tls,
            data,
            "",
            server.web.url,
            server,
        )
    finally:
        await server.stop()


def secure_agent(cluster: Secured, data_dir: Path, **config: Any) -> Agent:
    """secure_agent: the agent `secure-0` of the secured cluster, with the certificate made
    for it, on 127.0.0.1 (`config`: more AgentConfig fields)."""
    tls = cluster.tls
    settings: dict[str, Any] = {
        "path_prepend": (str(Path(sys.executable).parent),),
        "heartbeat_interval_s": 0.2,
        "fence_timeout_s": FAST.fence_timeout_s,
        "stop_pods_on_exit": True,
        **config,
    }
    return Agent(
        AgentConfig(
            server=cluster.agents,
            node_name="secure-0",
            address="127.0.0.1",
            data_dir=data_dir,
            tls=TlsFiles(tls / "ca.pem", tls / "secure-0.pem", tls / "secure-0.key"),
            **settings,
        ),
        NODE,
    )


async def issue(
    cluster: Secured, name: str, capsys: pytest.CaptureFixture[str], role: str = "user"
) -> str:
    """issue runs `arranger token create --user NAME NAME` (in a thread: it writes the store the
    server, on this loop, has open, as it would from another process)."""
    capsys.readouterr()
    argv = ("token", "create", "--user", name, "--role", role, name)
    assert await in_thread(*argv, "--data-dir", str(cluster.data_dir)) == 0
    token = capsys.readouterr().out.strip().splitlines()[-1]  # after any log line of the server
    assert token.startswith("arr_") and len(token) > 40
    return token


async def test_users_need_a_token_and_health_is_open(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with secured(tmp_path) as cluster:
        ca = cluster.tls / "ca.pem"
        async with AsyncClient(cluster.address, ca=ca) as anonymous:
            with pytest.raises(ArrangerError) as refused:
                await anonymous.jobs()
            assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
            assert "bearer token" in refused.value.message
        async with AsyncClient(cluster.address, ca=ca, token="arr_" + "x" * 43) as forger:
            with pytest.raises(ArrangerError) as refused:
                await forger.submit(job_spec("sneaky", leader=["true"]))
            assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
        async with AsyncClient(cluster.address) as plaintext:  # no TLS at all
            with pytest.raises(ArrangerError) as refused:
                await plaintext.jobs()
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE

        credentials = channel_credentials(TlsFiles(ca))
        async with grpc.aio.secure_channel(cluster.address, credentials) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING

        token = await issue(cluster, "alice", capsys)  # issued while the server runs
        async with AsyncClient(cluster.address, ca=ca, token=token) as alice:
            assert await alice.jobs() == []
            await alice.submit(job_spec("hers", leader=["true"]))
            assert [j.name for j in await alice.jobs()] == ["hers"]
        again = ("token", "create", "--user", "alice", "alice", "--data-dir", str(cluster.data_dir))
        assert await in_thread(*again) == 1
        assert "exists" in capsys.readouterr().err
        assert await in_thread("token", "list", "--data-dir", str(cluster.data_dir)) == 0
        listed = printed(capsys).splitlines()  # the server in this process may log meanwhile
        assert listed[0].split() == ["NAME", "USER", "ROLE", "CREATED", "LAST", "USED"]
        assert listed[1].split()[:3] == ["alice", "alice", "user"]

        # Revoked: refused once the server's revocation check sees it (REVOCATION_CHECK_S).
        assert await in_thread("token", "delete", "alice", "--data-dir", str(cluster.data_dir)) == 0
        async with AsyncClient(cluster.address, ca=ca, token=token) as alice:

            async def refused_now() -> bool:
                try:
                    await alice.jobs()
                except ArrangerError as exc:
                    return exc.code == grpc.StatusCode.UNAUTHENTICATED
                return False

            await eventually(refused_now, timeout_s=20, what="the revoked token to be refused")
        assert await in_thread("token", "delete", "alice", "--data-dir", str(cluster.data_dir)) == 1


@pytest.mark.e2e
async def test_agents_need_a_certificate_from_the_cluster_ca(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with secured(tmp_path) as cluster:
        tls, stranger = cluster.tls, tmp_path / "stranger"

        async def connect(files: TlsFiles, address: str) -> grpc.StatusCode:
            credentials = channel_credentials(files)
            async with grpc.aio.secure_channel(address, credentials) as channel:
                stub = agent_pb2_grpc.AgentServiceStub(channel)
                call = stub.Connect(iter([agent_pb2.AgentMessage()]), timeout=10)
                try:
                    async for _ in call:
                        pass
                except grpc.aio.AioRpcError as exc:
                    return exc.code()
            return grpc.StatusCode.OK

        user = TlsFiles(tls / "ca.pem")  # no client certificate
        # On the API port a user may not act as an agent; the agent port wants a certificate.
        assert await connect(user, cluster.address) == grpc.StatusCode.UNAUTHENTICATED
        assert await connect(user, cluster.agents) == grpc.StatusCode.UNAVAILABLE
        # A certificate another CA signed fails the handshake.
        foreign = TlsFiles(tls / "ca.pem", stranger / "secure-0.pem", stranger / "secure-0.key")
        assert await connect(foreign, cluster.agents) == grpc.StatusCode.UNAVAILABLE
        # An agent that trusts another CA does not talk to this server.
        fooled = TlsFiles(stranger / "ca.pem", tls / "secure-0.pem", tls / "secure-0.key")
        assert await connect(fooled, cluster.agents) == grpc.StatusCode.UNAVAILABLE

        # Its certificate names its node: it cannot register as another.
        impostor = Agent(
            AgentConfig(
                server=cluster.agents,
                node_name="someone-else",
                address="127.0.0.1",
                data_dir=tmp_path / "impostor",
                reconnect_max_s=0.2,
                tls=TlsFiles(tls / "ca.pem", tls / "secure-0.pem", tls / "secure-0.key"),
            ),
            NODE,
        )
        impostor.start()
        await eventually(
            lambda: "not the node this agent's certificate" in (impostor.last_error or ""),
            what="the impostor to be refused",
        )
        await impostor.stop()
        assert not impostor.connected.is_set()

        # The real agent joins and runs a job, all over mutual TLS.
        agent = secure_agent(cluster, tmp_path / "agent")
        agent.start()
        try:
            await eventually(agent.connected.is_set, what="the agent to join over mutual TLS")
            token = await issue(cluster, "ci", capsys)
            async with AsyncClient(cluster.address, ca=tls / "ca.pem", token=token) as client:
                ok = script(tmp_path, "ok", "pass\n")
                await client.submit(job_spec("secure", leader=ok, worker=ok))
                assert (await client.wait("secure", timeout_s=30)).status.stage == "Succeeded"
        finally:
            await agent.stop()


async def test_the_cli_takes_the_ca_and_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with secured(tmp_path) as cluster:
        token = await issue(cluster, "bob", capsys)
        ca = str(cluster.tls / "ca.pem")
        monkeypatch.setenv("ARRANGER_TOKEN", token)
        code = await in_thread("--server", cluster.address, "--ca", ca, "list")
        assert code == 0
        monkeypatch.delenv("ARRANGER_TOKEN")
        code = await in_thread("--server", cluster.address, "--ca", ca, "list")
        assert code == 1 and "bearer token" in capsys.readouterr().err


async def in_thread(*argv: str) -> int:
    """in_thread runs the CLI off this loop (the server under test runs on it)."""
    return await asyncio.to_thread(run_cli, *argv)
