"""A control plane down for a while kills nothing; a node whose agent is gone never runs a leader
twice.

Timings are scaled down through configuration (FAST: fenceTimeout 5 s, nodeTimeout 12 s, as
300 s and 330 s are by default): the server stays down for twice what the fence timeout used
to be (60 s of 300 s, scaled: 1 s), and every pod runs on. An agent stopped longer than the
fence timeout leaves no pod running: each pod's shim stops it, and only after that does the
server, which gives up on the node later, start the leader elsewhere.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import time
from pathlib import Path

import pytest

from arranger.agent.agent import Agent
from arranger.agent.config import AgentConfig
from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from arranger.server.app import ArrangerServer
from tests.conftest import FAST, NODE, Gate, eventually, job_spec, script
from tests.e2e.test_agent_crash import alive, running
from tests.e2e.test_agent_restart import connected, one_node

OLD_FENCE_S = FAST.fence_timeout_s * 60 / 300  # what the fence timeout was, at FAST's scale


@pytest.mark.timeout(120)
async def test_a_server_down_longer_than_the_old_fence_kills_nothing(
    cluster: DevCluster, tmp_path: Path, gate: Gate
) -> None:
    async with AsyncClient(cluster.address, timeout_s=10) as client:
        await client.submit(job_spec("patient", leader=gate.command(tmp_path), workers=3))
        await eventually(running(client, "patient", 3), what="the job to run")
        before = (await client.get("patient")).status
    pids = [before.leader.pid, *(w.pid for w in before.workers)]

    old = cluster.server
    await old.stop()  # the head node goes down
    outage = 2 * OLD_FENCE_S
    await eventually(
        lambda: all(a.contact.silent_s() > outage for a in cluster.agents),
        what="the agents to be cut off for longer than the fence used to be",
    )
    assert all(alive(p) for p in pids)
    cluster.serve_with(
        ArrangerServer(dataclasses.replace(old.config, listen=f"127.0.0.1:{old.port}"))
    )
    await cluster.server.start()

    async with AsyncClient(cluster.address, timeout_s=10) as client:
        await eventually(
            lambda: all(connected(cluster.server, a.config.node_name) for a in cluster.agents),
            what="the agents to come back",
        )
        after = (await client.get("patient")).status
        assert after.stage == "Running" and after.running_workers == 3
        assert [after.leader.pid, *(w.pid for w in after.workers)] == pids
        assert after.leader_restarts == 0
        assert all(n == 0 for n in after.worker_set_restarts.values())
        kinds = {e.kind for e in await client.events("patient")}
        assert not {"Restarting", "Requeued", "NodeLost"} & kinds, kinds
        gate.open()
        assert (await client.wait("patient", timeout_s=30)).status.stage == "Succeeded"


@pytest.mark.timeout(120)
async def test_the_pods_of_a_stopped_agent_stop_before_the_leader_starts_elsewhere(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "journal"
    # The leader notes when it starts and when it is told to stop (the fence sends SIGTERM).
    leader = script(
        tmp_path,
        "leader",
        f"""
import os, signal, sys, time
def note(what):
    with open({str(journal)!r}, "a") as f:
        f.write(f"{{time.time():.6f}} {{what}} {{os.getpid()}}\\n")
def stop(*_):
    note("stop")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
note("start")
while True:
    signal.pause()
""",
    )
    sleeps = script(tmp_path, "sleeps", "import signal\nsignal.pause()\n")
    async with one_node(tmp_path) as (server, client, far):
        await eventually(lambda: connected(server, "crashy"), what="the agent to join")
        await client.submit(job_spec("moving", leader=leader, worker=sleeps, workers=1))
        first = (await client.wait("moving", stages=["Running"], timeout_s=30)).status
        assert first.leader.node == "crashy"
        near = Agent(
            AgentConfig(
                server=f"127.0.0.1:{server.port}",
                node_name="near",
                address="127.0.0.1",
                data_dir=tmp_path / "near",
                path_prepend=(str(Path(sys.executable).parent),),
                heartbeat_interval_s=0.2,
                reconnect_max_s=0.3,
                stop_pods_on_exit=True,
            ),
            NODE,
        )
        near.start()
        try:
            await eventually(near.connected.is_set, what="the second agent to join")
            stopped_at = time.time()
            far.signal(signal.SIGTERM)  # stopped, and not started again

            async def moved() -> bool:
                st = (await client.get("moving")).status
                return st.stage == "Running" and st.leader.node == "near"

            await eventually(moved, timeout_s=60, what="the leader to start on the other node")
            await eventually(lambda: journal.read_text().count("start") == 2, what="the new leader")
            notes = sorted(
                (float(t), what, pid)
                for t, what, pid in map(str.split, journal.read_text().splitlines())
            )
            assert [what for _, what, _ in notes] == ["start", "stop", "start"]
            (_, _, old), (t_stop, _, stopped), (t_new, _, new) = notes
            assert stopped == old != new and t_stop < t_new, "never two leaders at once"
            assert t_stop > stopped_at + FAST.fence_timeout_s - 1, "not before the fence timeout"
            assert not alive(first.leader.pid) and not alive(first.workers[0].pid)
            assert "arranger: fenced" in "".join(
                p.read_text() for p in (tmp_path / "agent" / "logs").rglob("0.log")
            )
            await client.delete("moving")
        finally:
            await near.stop()
