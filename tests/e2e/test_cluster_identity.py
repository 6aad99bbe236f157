"""An agent obeys only the cluster it joined first.

An agent of cluster A, pointed at the server of a fresh store (cluster B), refuses it: it
carries out none of its orders (B would stop pods it never launched), says why, and its pods
run on. Pointed back at A, it carries on: the same pods, no restart counted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from arranger.agent.agent import Agent
from arranger.agent.config import AgentConfig
from arranger.client.sdk import AsyncClient
from arranger.server.app import ArrangerServer
from tests.conftest import FAST, NODE, Gate, eventually, job_spec
from tests.e2e.test_agent_crash import alive, running
from tests.e2e.test_agent_restart import stop_pods_of


@contextlib.asynccontextmanager
async def server_of(data_dir: Path) -> AsyncIterator[ArrangerServer]:
    """server_of: a server over its own store (a cluster of its own), on 127.0.0.1."""
    server = ArrangerServer(dataclasses.replace(FAST, listen="127.0.0.1:0", data_dir=data_dir))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def agent_of(server: ArrangerServer, data_dir: Path) -> Agent:
    config = AgentConfig(
        server=f"127.0.0.1:{server.port}",
        node_name="member",
        address="127.0.0.1",
        data_dir=data_dir,
        path_prepend=(str(Path(sys.executable).parent),),
        heartbeat_interval_s=0.2,
        fence_timeout_s=FAST.fence_timeout_s,
        reconnect_max_s=0.2,
    )
    agent = Agent(config, NODE)
    agent.start()
    return agent


@pytest.mark.timeout(120)
async def test_an_agent_obeys_no_server_of_another_cluster(tmp_path: Path, gate: Gate) -> None:
    data_dir = tmp_path / "agent"
    try:
        async with (
            server_of(tmp_path / "a") as a,
            server_of(tmp_path / "b") as b,
            AsyncClient(f"127.0.0.1:{a.port}", timeout_s=10) as client,
        ):
            assert a.store.cluster_id and a.store.cluster_id != b.store.cluster_id
            member = agent_of(a, data_dir)
            await eventually(member.connected.is_set, what="the agent to join cluster A")
            assert (data_dir / "cluster-id").read_text().strip() == a.store.cluster_id
            await client.submit(job_spec("loyal", leader=gate.command(tmp_path), workers=2))
            await eventually(running(client, "loyal", 2), what="the job to run")
            before = (await client.get("loyal")).status
            pids = [before.leader.pid, *(w.pid for w in before.workers)]
            await member.stop()  # its pods run on

            stray = agent_of(b, data_dir)  # the same node, pointed at cluster B's server
            try:
                await eventually(
                    lambda: "serves cluster" in (stray.last_error or ""),
                    what="the agent to refuse cluster B",
                )
                assert b.store.cluster_id in (stray.last_error or "")
                assert not stray.connected.is_set()
                assert all(alive(p) for p in pids), "no order of cluster B was carried out"
                assert all(not r.kill_requested for r in stray.supervisor.runs.values())
            finally:
                await stray.stop()

            member = agent_of(a, data_dir)  # pointed back at A
            try:
                await eventually(member.connected.is_set, what="the agent to rejoin cluster A")
                await eventually(
                    lambda: a.controller.nodes["member"].connected, what="A to admit it"
                )
                after = (await client.get("loyal")).status
                assert after.stage == "Running"
                assert [after.leader.pid, *(w.pid for w in after.workers)] == pids
                assert after.leader_restarts == 0
                assert all(n == 0 for n in after.worker_set_restarts.values())
                gate.open()
                assert (await client.wait("loyal", timeout_s=30)).status.stage == "Succeeded"
            finally:
                await member.stop()
    finally:
        stop_pods_of(data_dir)
