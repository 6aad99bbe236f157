"""An agent that comes back keeping directories of jobs the server no longer has (pruned or
deleted while it was away) is told to remove them, on registering, and does once they are
older than the jobs' retention the server reports (younger ones may be of jobs a store restored
from a backup does not know); a job the server has keeps its logs. Real server, real agents on
127.0.0.1."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from arranger.agent.agent import Agent
from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from tests.conftest import eventually, job_spec, script

GONE = "0123456789ab"  # a job id no server here ever had
YOUNG = "ba9876543210"  # another, whose files are younger than the retention


async def test_a_returning_agent_removes_what_the_server_no_longer_has(
    cluster: DevCluster, client: AsyncClient
) -> None:
    done = (await client.submit(job_spec("done", ["true"], workers=1))).metadata.id

    async def finished() -> bool:
        return (await client.get("done")).status.stage == "Succeeded"

    await eventually(finished, what="the job to finish")
    kept = [
        path
        for agent in cluster.agents
        for kind in ("logs", "runs")
        if (path := agent.config.data_dir / kind / done).exists()
    ]
    assert kept, "the finished job left no logs"
    first = cluster.agents[0]
    retention_s = cluster.server.config.job_retention_s
    old = time.time() - retention_s - 60
    leftovers = [first.config.data_dir / kind / GONE for kind in ("logs", "scratch", "runs")]
    young = [first.config.data_dir / kind / YOUNG for kind in ("logs", "scratch", "runs")]
    for path in [*leftovers, *young]:
        (path / "learner").mkdir(parents=True)
        (path / "learner" / "0.log").write_text("from a job the server has no record of\n")
        if path in leftovers:
            for touched in (path / "learner" / "0.log", path / "learner", path):
                os.utime(touched, (old, old))
    await first.stop()
    # (resyncs often: each looks again at what it keeps that has aged)
    again = Agent(dataclasses.replace(first.config, resync_interval_s=0.5), cluster.capacity)
    cluster.agents[0] = again
    again.start()
    await eventually(lambda: not any(p.exists() for p in leftovers), what="the leftovers gone")
    assert again.job_retention_s == retention_s > 0
    assert all(path.exists() for path in [*kept, *young])
    # Past the retention while the agent stays connected: removed at a later resync.
    for path in young:
        for touched in (path / "learner" / "0.log", path / "learner", path):
            os.utime(touched, (old, old))
    await eventually(lambda: not any(p.exists() for p in young), what="aged leftovers gone")
    assert all(path.exists() for path in kept)


async def test_a_job_still_running_here_is_never_purged(
    cluster: DevCluster, client: AsyncClient, tmp_path: Path
) -> None:
    waits = script(tmp_path, "waits", "import signal\nsignal.pause()\n")
    job_id = (await client.submit(job_spec("busy", waits, workers=1))).metadata.id

    async def running() -> bool:
        return (await client.get("busy")).status.stage == "Running"

    await eventually(running, what="the job to run")
    (agent,) = [
        a for a in cluster.agents if any(r.job_id == job_id for r in a.supervisor.runs.values())
    ][:1]
    agent.supervisor.purge(job_id)  # as a wrong order would ask
    for kind in ("logs", "runs"):
        assert (agent.config.data_dir / kind / job_id).is_dir()
    assert (await client.get("busy")).status.stage == "Running"
    assert all(not r.ended.is_set() for r in agent.supervisor.runs.values() if r.job_id == job_id)
