"""Failures on a real cluster: a node that goes away, a server that goes silent, crash loops."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import psutil

from arranger.client.sdk import AsyncClient
from arranger.server.controller import ControllerConfig
from tests.conftest import FAST, eventually, job_spec, running_cluster, script

SLEEP = "import signal; signal.pause()  # runs until stopped\n"


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_a_lost_node_sends_the_job_to_rescheduling_and_it_runs_again_elsewhere(
    tmp_path: Path,
) -> None:
    async with running_cluster(tmp_path / "c") as cluster, AsyncClient(cluster.address) as client:
        await client.submit(job_spec("moving", leader=script(tmp_path, "s", SLEEP), workers=2))
        before = (await client.wait("moving", stages=["Running"], timeout_s=30)).status
        lost_node = before.leader.node
        assert {w.node for w in before.workers} == {lost_node}  # BinPack packs one node
        agent = next(a for a in cluster.agents if a.config.node_name == lost_node)
        await agent.stop()  # the machine goes away: its processes end, its agent is silent

        async def running_elsewhere() -> bool:
            st = (await client.get("moving")).status
            return (
                st.stage == "Running"
                and st.leader.node not in ("", lost_node)
                and st.running_workers == 2
            )

        await eventually(running_elsewhere, timeout_s=40, what="the job to run on the other node")
        after = (await client.get("moving")).status
        assert after.leader_restarts == 0 and after.leader.attempt == 1  # lost: no restart spent
        assert after.leader_address != before.leader_address
        assert all(w.node == after.leader.node and w.attempt == 1 for w in after.workers)
        kinds = [e.kind for e in await client.events("moving")]
        assert "Rescheduling" in kinds and kinds.index("Rescheduling") > kinds.index("Running")
        assert any(e.kind == "NodeLost" for e in await client.events())
        nodes = {n.name: n.state for n in await client.nodes()}
        assert nodes[lost_node] == "NotReady"
        await client.delete("moving")


async def test_agents_stop_their_pods_when_the_server_goes_silent(tmp_path: Path) -> None:
    async with running_cluster(tmp_path / "c") as cluster:
        async with AsyncClient(cluster.address) as client:
            await client.submit(job_spec("fenced", leader=script(tmp_path, "s", SLEEP), workers=2))
            st = (await client.wait("fenced", stages=["Running"], timeout_s=30)).status
        pids = [st.leader.pid, *(w.pid for w in st.workers)]
        assert all(alive(p) for p in pids)
        await cluster.server.stop()  # the agents hear nothing more
        await eventually(
            lambda: not any(alive(p) for p in pids),
            timeout_s=FAST.fence_timeout_s + 10,
            what="the agents to fence their pods",
        )


async def test_restarts_wait_for_a_doubling_back_off(tmp_path: Path) -> None:
    config = dataclasses.replace(
        FAST,
        controller=ControllerConfig(
            backoff_initial_s=0.4, backoff_max_s=5.0, kill_grace_s=2.0, node_timeout_s=12.0
        ),
    )
    crash = script(tmp_path, "crash", "import time\nprint(time.time())\nraise SystemExit(1)\n")
    async with (
        running_cluster(tmp_path / "c", config=config) as cluster,
        AsyncClient(cluster.address) as client,
    ):
        await client.submit(
            job_spec("loop", leader=crash, worker=script(tmp_path, "s", SLEEP), restartLimit=2)
        )
        done = await client.wait("loop", timeout_s=30)
        assert done.status.stage == "Failed" and done.status.leader_restarts == 2
        starts = [
            float(b"".join([c async for c in client.logs("loop", attempt=a)])) for a in range(3)
        ]
    assert starts[1] - starts[0] >= 0.4 and starts[2] - starts[1] >= 0.8
