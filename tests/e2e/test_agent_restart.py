"""Restarts and upgrades of arranger-agent never kill work.

SIGTERM (what systemd sends) stops a real `arranger-agent` process alone: its pods run on,
and the next agent over the same data directory adopts them with the same process ids; the
server counts no restart and the job stays Running. `arranger dev`, which owns its cluster,
stops its pods when it stops; started again over the same data directory, it runs them again
as a requeue, never as a failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from arranger.client.sdk import AsyncClient
from arranger.server.app import ArrangerServer
from tests.conftest import FAST, Gate, eventually, job_spec, running_cluster
from tests.e2e.test_agent_crash import AgentProcess, alive, running


def stop_pods_of(data_dir: Path) -> None:
    """stop_pods_of kills the process group of every pod an agent over data_dir still
    records (what a failed test would otherwise leave running)."""
    for record in data_dir.glob("runs/*/*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            os.killpg(int(json.loads(record.read_text())["pid"]), signal.SIGKILL)


@contextlib.asynccontextmanager
async def one_node(
    directory: Path,
) -> AsyncIterator[tuple[ArrangerServer, AsyncClient, AgentProcess]]:
    """one_node: a server in this process and one real arranger-agent, "crashy"."""
    config = dataclasses.replace(FAST, listen="127.0.0.1:0", data_dir=directory / "server")
    server = ArrangerServer(config)
    await server.start()
    agent = AgentProcess(directory, f"127.0.0.1:{server.port}")
    try:
        agent.start()
        async with AsyncClient(f"127.0.0.1:{server.port}", timeout_s=10) as client:
            yield server, client, agent
    finally:
        agent.signal(signal.SIGTERM)
        stop_pods_of(directory / "agent")
        await server.stop()


@contextlib.asynccontextmanager
async def dev_client(data_dir: Path) -> AsyncIterator[AsyncClient]:
    """dev_client: a client of a dev cluster over data_dir, stopped (as Ctrl-C does) after."""
    async with (
        running_cluster(data_dir) as cluster,
        AsyncClient(cluster.address, timeout_s=10) as client,
    ):
        yield client


def connected(server: ArrangerServer, node: str) -> bool:
    record = server.controller.nodes.get(node)
    return record is not None and record.connected


@pytest.mark.timeout(120)
async def test_sigterm_leaves_pods_running_for_the_next_agent(tmp_path: Path, gate: Gate) -> None:
    waits = gate.command(tmp_path, "waits")
    async with one_node(tmp_path) as (server, client, agent):
        await eventually(lambda: connected(server, "crashy"), what="the agent to join")
        await client.submit(job_spec("steady", leader=waits, workers=4))
        await eventually(running(client, "steady", 4), what="the 1+4 job to run")
        before = (await client.get("steady")).status
        pids = [before.leader.pid, *(w.pid for w in before.workers)]

        agent.signal(signal.SIGTERM)  # systemctl stop (or restart, or an upgrade)
        await eventually(lambda: not connected(server, "crashy"), what="the server to notice")
        assert all(alive(p) for p in pids), "SIGTERM stopped the agent alone"
        agent.start()  # the next agent, same data directory
        await eventually(lambda: connected(server, "crashy"), what="the new agent to register")

        after = (await client.get("steady")).status
        assert after.stage == "Running" and after.running_workers == 4
        assert [after.leader.pid, *(w.pid for w in after.workers)] == pids
        assert [after.leader.attempt, *(w.attempt for w in after.workers)] == [0] * 5
        assert after.leader_restarts == 0 and all(
            n == 0 for n in after.worker_set_restarts.values()
        )
        assert all(alive(p) for p in pids)
        assert (tmp_path / "agent.log").read_text().count("pod adopted") == 5
        events = [e.kind for e in await client.events("steady")]
        assert not {"Restarting", "Requeued", "WorkerFailed"} & set(events), events
        gate.open()
        assert (await client.wait("steady", timeout_s=30)).status.stage == "Succeeded"


@pytest.mark.timeout(120)
async def test_dev_runs_the_pods_it_stopped_again_without_counting_a_restart(
    tmp_path: Path, gate: Gate
) -> None:
    waits = gate.command(tmp_path, "waits")
    async with dev_client(tmp_path / "dev") as client:
        await client.submit(job_spec("resumed", leader=waits, workers=2))
        await eventually(running(client, "resumed", 2), what="the job to run")
        before = (await client.get("resumed")).status
    # Ctrl-C of arranger dev: its agents stop their pods, then the server stops.
    assert not any(alive(p) for p in [before.leader.pid, *(w.pid for w in before.workers)])

    async with dev_client(tmp_path / "dev") as client:
        await eventually(running(client, "resumed", 2), what="the job to run again")
        after = (await client.get("resumed")).status
        assert after.leader.attempt == 1 and all(w.attempt == 1 for w in after.workers)
        assert after.leader_restarts == 0
        assert all(n == 0 for n in after.worker_set_restarts.values())
        events = await client.events("resumed")
        requeued = [e.pod for e in events if e.kind == "Requeued"]
        assert sorted(requeued) == sorted(p.name for p in [before.leader, *before.workers])
        assert not any(e.kind in ("Restarting", "WorkerFailed") for e in events)
        gate.open()
        assert (await client.wait("resumed", timeout_s=30)).status.stage == "Succeeded"
