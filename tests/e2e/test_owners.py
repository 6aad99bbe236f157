"""Two users share one cluster end to end: a TLS server, their own tokens, a root agent with
runAs: owner. Each user's job runs as their own account; neither may read the other's logs;
a log over the agent's maxLogBytes keeps its newest part and `arranger logs` says what went."""

from __future__ import annotations

import contextlib
import pwd
from pathlib import Path

import grpc
import pytest

from arranger.agent.agent import Agent
from arranger.agent.config import AgentConfig
from arranger.client.sdk import ArrangerError, AsyncClient
from arranger.security import TlsFiles
from tests.agent.rootagent import local_users, shared_dir
from tests.agent.test_privileges import attacker_dir, hostile_env
from tests.conftest import FAST, NODE, eventually, job_spec
from tests.server.test_auth import in_thread, issue, secure_agent, secured

LIMIT = 64 * 1024
# The leader says who it runs as, then writes 300 KB: more than the log may keep.
CHATTY = [
    "/bin/sh",
    "-c",
    "id -un; i=0; while [ $i -lt 3000 ]; do "
    "echo line-$i-......................................................................; "
    "i=$((i+1)); done; echo last-line",
]


async def test_each_users_job_runs_as_them_and_their_logs_are_theirs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with local_users(2) as (alice, bob), shared_dir() as top:
        async with secured(tmp_path) as cluster:
            tls = cluster.tls
            agent = secure_agent(
                cluster, top / "agent", path_prepend=(), run_as="owner", max_log_bytes=LIMIT
            )
            agent.start()
            try:
                await eventually(agent.connected.is_set, what="the root agent to join")
                await run_as_owners(cluster.address, tls / "ca.pem", cluster, alice, bob, capsys)
            finally:
                await agent.stop()


async def run_as_owners(
    address: str,
    ca: Path,
    cluster: object,
    alice: pwd.struct_passwd,
    bob: pwd.struct_passwd,
    capsys: pytest.CaptureFixture[str],
) -> None:
    tokens = {u.pw_name: await issue(cluster, u.pw_name, capsys) for u in (alice, bob)}  # type: ignore[arg-type]
    async with contextlib.AsyncExitStack() as stack:
        clients = {
            name: await stack.enter_async_context(AsyncClient(address, ca=ca, token=t))
            for name, t in tokens.items()
        }
        a, b = clients[alice.pw_name], clients[bob.pw_name]
        await a.submit(job_spec("hers", CHATTY, ["/bin/true"]))
        await b.submit(job_spec("his", ["/bin/sh", "-c", "id -un"], ["/bin/true"]))
        for client, name in ((a, "hers"), (b, "his")):
            done = await client.wait(name, timeout_s=60)
            assert done.status.stage == "Succeeded", done.status
        his = b"".join([chunk async for chunk in b.logs("his")]).decode()
        assert his.splitlines()[0] == bob.pw_name

        # Alice's log kept its newest part; the first line (who it ran as) was dropped.
        chunks = [chunk async for chunk in a.log_chunks("hers")]
        chunks = [c for c in chunks if not c.HasField("attempt")]  # the header says which attempt
        dropped = sum(c.dropped_bytes for c in chunks[:1])
        text = b"".join(c.data for c in chunks).decode(errors="replace")
        assert dropped > 0 and text.rstrip().endswith("last-line")
        assert len(text) <= LIMIT + 4096 and alice.pw_name not in text

        with pytest.raises(ArrangerError) as refused:
            await anext(b.logs("hers"))
        assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED

        # The CLI says what was dropped.
        capsys.readouterr()
        argv = ("--server", address, "--ca", str(ca), "--token", tokens[alice.pw_name])
        assert await in_thread(*argv, "logs", "hers") == 0
        out = capsys.readouterr()
        assert "of older output was dropped (the agent's maxLogBytes)]" in out.err
        assert out.out.rstrip().endswith("last-line")


async def test_hostile_environments_through_the_api_are_refused_or_run_harmlessly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The attacks of tests/agent/test_privileges.py, sent through the API by a user: what the
    server refuses (deniedEnv) is refused naming the field; the rest runs as the user alone."""
    with local_users(1) as (mallory,), shared_dir() as top:
        evil, notes = attacker_dir(top)
        async with secured(tmp_path) as cluster:
            tls = cluster.tls
            agent = Agent(
                AgentConfig(
                    server=cluster.agents,
                    node_name="secure-0",
                    address="127.0.0.1",
                    data_dir=top / "agent",
                    heartbeat_interval_s=0.2,
                    fence_timeout_s=FAST.fence_timeout_s,
                    run_as="owner",
                    stop_pods_on_exit=True,
                    tls=TlsFiles(tls / "ca.pem", tls / "secure-0.pem", tls / "secure-0.key"),
                ),
                NODE,
            )
            agent.start()
            try:
                await eventually(agent.connected.is_set, what="the root agent to join")
                token = await issue(cluster, mallory.pw_name, capsys)  # type: ignore[arg-type]
                async with AsyncClient(cluster.address, ca=tls / "ca.pem", token=token) as client:
                    env = hostile_env(evil)
                    refused = job_spec("refused", ["attack"])
                    refused["spec"]["leader"]["template"]["env"] = env
                    with pytest.raises(ArrangerError) as caught:
                        await client.submit(refused)
                    assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED
                    for name in ("BASH_ENV", "ENV", "IFS"):
                        assert f"spec.leader.template.env.{name}: may not be set" in (
                            caught.value.message
                        )
                    allowed = {k: v for k, v in env.items() if k not in ("BASH_ENV", "ENV", "IFS")}
                    body = job_spec("harmless", ["attack"], ["python3", "-c", "pass"])
                    for template in (body["spec"]["leader"], body["spec"]["workerSets"][0]):
                        template["template"]["env"] = allowed
                        template["template"]["workingDir"] = str(evil)
                    await client.submit(body)
                    done = await client.wait("harmless", timeout_s=60)
                    assert done.status.stage in ("Succeeded", "Failed"), done.status
            finally:
                await agent.stop()
        lines = notes.read_text().split("\n")
        ran = [line.split() for line in lines if line.strip()]
        assert ran, "the attacker's programs ran (as the user), so the test saw them"
        assert all(uid == str(mallory.pw_uid) for _, uid in ran), ran
