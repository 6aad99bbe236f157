"""Packages over TLS: users upload them only with a token; an agent fetches one only for a
job with a pod on the node its certificate names, and then runs that job from it."""

from __future__ import annotations

import sys
from pathlib import Path

import grpc
import pytest

from arranger.agent.agent import Agent
from arranger.agent.config import AgentConfig
from arranger.client.package import chunks, pack, ship
from arranger.client.sdk import ArrangerError, AsyncClient
from arranger.security import TlsFiles, channel_credentials
from arranger.v1 import agent_pb2, agent_pb2_grpc
from tests.conftest import FAST, NODE, eventually, job_spec
from tests.server.test_auth import issue, secured


@pytest.mark.e2e
async def test_packages_need_a_token_to_upload_and_a_pod_on_the_node_to_fetch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "proj"
    source.mkdir()
    (source / "train.py").write_text("import helpers\n")
    (source / "helpers.py").write_text("")
    async with secured(tmp_path) as cluster:
        tls = cluster.tls
        async with AsyncClient(cluster.address, ca=tls / "ca.pem") as anonymous:
            packed = pack(source, tmp_path)
            calls = (
                anonymous.has_package(packed.sha256),
                anonymous.upload_package(lambda: chunks(packed)),
            )
            for call in calls:
                with pytest.raises(ArrangerError) as refused:
                    await call
                assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
        token = await issue(cluster, "alice", capsys)
        async with AsyncClient(cluster.address, ca=tls / "ca.pem", token=token) as alice:
            package = (await ship(alice, source)).package

            agent_tls = TlsFiles(tls / "ca.pem", tls / "secure-0.pem", tls / "secure-0.key")
            async with grpc.aio.secure_channel(
                cluster.agents, channel_credentials(agent_tls)
            ) as channel:
                stub = agent_pb2_grpc.AgentServiceStub(channel)
                # The node a request names counts for nothing: the certificate's does.
                request = agent_pb2.FetchPackageRequest(sha256=package.sha256, node_name="any")
                with pytest.raises(grpc.aio.AioRpcError) as denied:
                    async for _ in stub.FetchPackage(request, timeout=10):
                        pass
                assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert "no job that names it has a pod on node 'secure-0'" in (
                    denied.value.details() or ""
                )

            agent = Agent(
                AgentConfig(
                    server=cluster.agents,
                    node_name="secure-0",
                    address="127.0.0.1",
                    data_dir=tmp_path / "agent",
                    path_prepend=(str(Path(sys.executable).parent),),
                    heartbeat_interval_s=0.2,
                    fence_timeout_s=FAST.fence_timeout_s,
                    stop_pods_on_exit=True,
                    tls=agent_tls,
                ),
                NODE,
            )
            agent.start()
            try:
                await eventually(agent.connected.is_set, what="the agent to join")
                run = [sys.executable, "train.py"]
                await alice.submit(job_spec("shipped", leader=run, worker=run), source)
                done = await alice.wait("shipped", timeout_s=30)
                assert done.status.stage == "Succeeded", done.status
                assert agent.supervisor.packages is not None
                assert agent.supervisor.packages.fetched == 1
            finally:
                await agent.stop()


async def test_another_users_job_does_not_show_its_package(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A package's hash is what lets a job name it: a user who read another's could run
    that user's working directory in a job of their own."""
    source = tmp_path / "proj"
    source.mkdir()
    (source / "secret.py").write_text("KEY = 'alice only'\n")
    async with secured(tmp_path) as cluster:
        ca = cluster.tls / "ca.pem"
        alice_token = await issue(cluster, "alice", capsys)
        bob_token = await issue(cluster, "bob", capsys)
        async with (
            AsyncClient(cluster.address, ca=ca, token=alice_token) as alice,
            AsyncClient(cluster.address, ca=ca, token=bob_token) as bob,
        ):
            run = [sys.executable, "secret.py"]
            await alice.submit(job_spec("private", leader=run, worker=run), source)
            mine = (await alice.get("private")).spec.package
            assert len(mine.sha256) == 64
            theirs = (await bob.get("private")).spec.package
            assert mine.sha256 not in str(theirs)
