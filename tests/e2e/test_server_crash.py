"""kill -9 of arranger-server in the middle of a flood of submits, then a restart on the same
SQLite file: every acknowledged job is there and whole, a job that was not acknowledged is
whole or absent, running processes were neither restarted nor placed twice, and the running
job finishes.

The server is a real `arranger-server` process killed with SIGKILL; the agents are real agents
in this process (their pods are our children, so the leftover-process check covers them).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from arranger.agent.agent import Agent
from arranger.agent.config import AgentConfig
from arranger.client.sdk import ArrangerError, AsyncClient
from tests.conftest import NODE, Gate, eventually, job_spec, script
from tests.server_process import SETTINGS, ServerProcess


@contextlib.asynccontextmanager
async def crashable(directory: Path) -> AsyncIterator[tuple[ServerProcess, list[Agent]]]:
    server = ServerProcess(directory)
    agents: list[Agent] = []
    try:
        await server.start()
        for i in range(2):
            config = AgentConfig(
                server=server.address,
                node_name=f"node-{i}",
                address="127.0.0.1",
                data_dir=directory / f"agent-{i}",
                path_prepend=(str(Path(sys.executable).parent),),
                fence_timeout_s=SETTINGS["fenceTimeoutSeconds"],
                heartbeat_interval_s=0.2,
                reconnect_max_s=0.3,
                stop_pods_on_exit=True,
            )
            agent = Agent(config, NODE)
            agent.start()
            agents.append(agent)
        async with asyncio.timeout(30):
            await asyncio.gather(*(a.connected.wait() for a in agents))
        yield server, agents
    finally:
        await asyncio.gather(*(a.stop() for a in agents), return_exceptions=True)
        server.kill()


def parked(name: str, tmp_path: Path) -> dict[str, object]:
    """parked: a job that is stored and scheduled but never placed (no node has the label)."""
    spec = job_spec(name, leader=script(tmp_path, "never", "pass\n"), workers=3)
    spec["spec"]["leader"]["template"]["nodeSelector"] = {"pool": "none"}  # type: ignore[index]
    return spec


@pytest.mark.timeout(180)
async def test_kill_9_mid_submit_loses_no_acknowledged_job_and_restarts_no_process(
    tmp_path: Path, gate: Gate
) -> None:
    waits = gate.command(tmp_path, "waits")
    async with crashable(tmp_path) as (server, _agents):
        async with AsyncClient(server.address, timeout_s=10) as client:
            await client.submit(job_spec("running", leader=waits, worker=waits, workers=3))
            before = (await client.wait("running", stages=["Running"], timeout_s=30)).status

        acknowledged: set[str] = set()
        refused: set[str] = set()

        async def flood(worker: int) -> None:
            async with AsyncClient(server.address, timeout_s=5) as c:
                for n in range(1000):
                    name = f"flood-{worker}-{n}"
                    try:
                        await c.submit(parked(name, tmp_path), queue_anyway=True)
                    except ArrangerError:
                        refused.add(name)  # in flight when the server died: there or not
                        return
                    acknowledged.add(name)

        clients = [asyncio.create_task(flood(w)) for w in range(8)]
        await eventually(lambda: len(acknowledged) >= 100, what="100 acknowledged submits")
        server.kill()  # mid-flood: submits are in flight, a cycle may be too
        await asyncio.gather(*clients)
        assert len(refused) == len(clients)  # every client was cut off mid-flood
        await server.start()

        async with AsyncClient(server.address, timeout_s=10) as client:
            stored = {j.name: j for j in await client.jobs()}
            assert acknowledged <= stored.keys(), sorted(acknowledged - stored.keys())[:5]
            assert stored.keys() <= acknowledged | refused | {"running"}
            for name in stored.keys() - {"running"}:  # whole: every pod of the spec is there
                job = await client.get(name)
                assert len(job.status.workers) == 3 and job.status.leader.name, name

            async def readopted() -> bool:
                status = (await client.get("running")).status
                return status.stage == "Running" and all(
                    p.state == "Running" for p in [status.leader, *status.workers]
                )

            await eventually(readopted, what="the agents to report the running pods again")
            after = (await client.get("running")).status
            assert after.leader.pid == before.leader.pid and after.leader.attempt == 0
            assert sorted((w.name, w.pid, w.attempt) for w in after.workers) == sorted(
                (w.name, w.pid, w.attempt) for w in before.workers
            )
            gate.open()
            assert (await client.wait("running", timeout_s=30)).status.stage == "Succeeded"
