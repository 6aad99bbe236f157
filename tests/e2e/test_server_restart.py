"""The server stops and starts again on the same store: every job and state is there, and
running processes carry on (their agents reconnect and report them)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from arranger.server.app import ArrangerServer
from tests.conftest import Gate, eventually, job_spec, script


@pytest.fixture
async def cluster(cluster_on_each_store: DevCluster) -> DevCluster:
    """cluster: every test here runs on a SQLite store and on a PostgreSQL one."""
    return cluster_on_each_store


SLEEP = "import signal; signal.pause()  # runs until stopped\n"


async def test_jobs_and_states_survive_a_server_restart(
    cluster: DevCluster, tmp_path: Path, gate: Gate
) -> None:
    waits = gate.command(tmp_path, "waits")
    sleep = script(tmp_path, "sleep", SLEEP)
    async with AsyncClient(cluster.address) as client:
        await client.submit(
            job_spec("finished", leader=script(tmp_path, "ok", "pass\n"), worker=sleep)
        )
        await client.submit(
            job_spec(
                "failed",
                leader=script(tmp_path, "bad", "raise SystemExit(2)\n"),
                worker=sleep,
                restartLimit=0,
            )
        )
        await client.submit(job_spec("running", leader=waits, worker=sleep, workers=2))
        # Fits the empty cluster (a pod on each node) but not beside `running`: it waits, and
        # is never failed as infeasible, however long the restart takes.
        await client.submit(
            job_spec("waiting", leader=sleep, worker=sleep, cpu=3.95, workers=1, minWorkersNum=1)
        )
        assert (await client.wait("finished", timeout_s=30)).status.stage == "Succeeded"
        assert (await client.wait("failed", timeout_s=30)).status.stage == "Failed"
        before = await client.wait("running", stages=["Running"], timeout_s=30)
        waiting = (await client.get("waiting")).status
        assert waiting.stage == "Pending" and waiting.schedule_state == "Unscheduled"

    old = cluster.server
    await old.stop()
    cluster.serve_with(
        ArrangerServer(dataclasses.replace(old.config, listen=f"127.0.0.1:{old.port}"))
    )
    await cluster.server.start()

    async with AsyncClient(cluster.address) as client:
        jobs = {j.name: j.progress for j in await client.jobs()}
        assert {n: s.stage for n, s in jobs.items()} == {
            "finished": "Succeeded",
            "failed": "Failed",
            "running": "Running",
            "waiting": "Pending",
        }
        assert (
            jobs["failed"].reason == "LeaderFailed" and jobs["finished"].reason == "LeaderSucceeded"
        )
        assert jobs["running"].leader_address == before.status.leader_address

        async def agents_back() -> bool:
            nodes = await client.nodes()
            return (
                len(nodes) == 2
                and all(n.state == "Ready" for n in nodes)
                and len(cluster.server.links) == 2
            )

        await eventually(agents_back, what="agents to reconnect")
        after = (await client.get("running")).status
        assert after.leader.pid == before.status.leader.pid, (
            "the running leader was re-adopted, not restarted"
        )
        assert [w.pid for w in after.workers] == [w.pid for w in before.status.workers]
        assert after.leader.attempt == 0
        gate.open()
        assert (await client.wait("running", timeout_s=30)).status.stage == "Succeeded"
        await client.delete("waiting")
