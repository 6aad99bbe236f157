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
from tests.conftest import FAST, NODE, eventually, job_spec
from tests.server.test_auth import in_thread, issue, secured

LIMIT = 64 * 1024
# The leader says who it runs as, then writes 300 KB: more than the log may keep.
CHATTY = ["/bin/sh", "-c", "id -un; i=0; while [ $i -lt 3000 ]; do "
          "echo line-$i-......................................................................; "
          "i=$((i+1)); done; echo last-line"]  # fmt: skip


async def test_each_users_job_runs_as_them_and_their_logs_are_theirs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with local_users(2) as (alice, bob), shared_dir() as top:
        async with secured(tmp_path) as cluster:
            tls = cluster.tls
            agent = Agent(
                AgentConfig(
                    server=cluster.agents, node_name="secure-0", address="127.0.0.1",
                    data_dir=top / "agent", heartbeat_interval_s=0.2,
                    fence_timeout_s=FAST.fence_timeout_s, run_as="owner", max_log_bytes=LIMIT,
                    stop_pods_on_exit=True,
                    tls=TlsFiles(tls / "ca.pem", tls / "secure-0.pem", tls / "secure-0.key"),
                ),
                NODE,
            )  # fmt: skip
            agent.start()
            try:
                await eventually(agent.connected.is_set, what="the root agent to join")
                await run_as_owners(cluster.address, tls / "ca.pem", cluster, alice, bob, capsys)
            finally:
                await agent.stop()


async def run_as_owners(
    address: str, ca: Path, cluster: object, alice: pwd.struct_passwd, bob: pwd.struct_passwd,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
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
