"""A server frozen with SIGSTOP while the standby takes over, then resumed: it neither writes
nor starts nor kills anything, and steps down to be a standby of the new active server. The
agents, given both servers, move to the new one on their own; running pods are untouched.

Both servers are real `arranger-server` processes sharing a real PostgreSQL database
(tests/postgres.py); the agents are real agents in this process.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import psutil
import pytest

from arranger.agent.agent import Agent
from arranger.client.sdk import ArrangerError, AsyncClient
from tests.conftest import Gate, eventually, job_spec
from tests.postgres import PostgresServer
from tests.server_process import ServerProcess, start_agents

SHARED = {"leaseSeconds": 2, "fenceTimeoutSeconds": 40, "nodeTimeoutSeconds": 60}


@pytest.mark.timeout(180)
async def test_a_frozen_server_resumed_after_a_takeover_changes_nothing_and_steps_down(
    tmp_path: Path, postgres: PostgresServer, gate: Gate
) -> None:
    url = postgres.new_database()
    a = ServerProcess(tmp_path / "a", store=url, **SHARED)  # --init makes the schema
    b = ServerProcess(tmp_path / "b", init=False, store=url, **SHARED)
    agents: list[Agent] = []
    try:
        await a.start()
        b.launch()
        agents += start_agents(tmp_path, f"{a.address},{b.address}", 2)
        await eventually(lambda: all(x.connected.is_set() for x in agents), what="agents")

        async with AsyncClient(a.address, timeout_s=10) as on_a:
            await on_a.submit(job_spec("steady", gate.command(tmp_path), workers=3))
            before = await on_a.wait("steady", stages=["Running"], timeout_s=30)
        pods = [before.status.leader, *before.status.workers]
        pids = {p.name: p.pid for p in pods}
        attempts = {p.name: p.attempt for p in pods}

        first_epoch = agents[0].membership.epoch
        a.signal(signal.SIGSTOP)
        frozen = time.monotonic()
        await eventually(b.serving, timeout_s=30, what="the standby to take over")
        took_over = time.monotonic() - frozen

        def on_b() -> bool:
            return all(x.server == b.address and x.connected.is_set() for x in agents)

        await eventually(on_b, timeout_s=30, what="the agents to move to the new server")
        moved = time.monotonic() - frozen
        async with AsyncClient(b.address, timeout_s=10) as client:
            await client.submit(job_spec("after", ["true"], workers=1))
            assert (await client.wait("after", timeout_s=30)).status.stage == "Succeeded"

            a.signal(signal.SIGCONT)

            async def a_is_a_standby() -> bool:
                async with AsyncClient(a.address, timeout_s=5) as on_a:
                    try:
                        await on_a.jobs()
                    except ArrangerError as exc:
                        return f"the active server is {b.address}" in exc.message
                return False

            await eventually(a_is_a_standby, timeout_s=30, what="the resumed server to step down")
            log = a.log.read_text()
            assert "stepping down" in log, log[-2000:]
            after = await client.get("steady")
            now = [after.status.leader, *after.status.workers]
            assert after.status.stage == "Running"
            assert {p.name: p.pid for p in now} == pids  # nothing was started again
            assert {p.name: p.attempt for p in now} == attempts
            assert all(psutil.pid_exists(pid) for pid in pids.values())  # nor killed
            epochs = {x.membership.epoch for x in agents}
            assert len(epochs) == 1 and epochs.pop() > first_epoch
            gate.open()
            assert (await client.wait("steady", timeout_s=30)).status.stage == "Succeeded"
        print(f"takeover after {took_over:.1f} s; agents moved after {moved:.1f} s")
    finally:
        await asyncio.gather(*(x.stop() for x in agents), return_exceptions=True)
        a.kill()
        b.kill()
