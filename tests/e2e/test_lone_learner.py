"""A job without worker sets (a lone learner) on a real cluster: placed, started and run to
success with ARRANGER_NUM_WORKERS 0, and shown by get, list and explain like any job."""

from __future__ import annotations

from pathlib import Path

import pytest

from arranger.client.dev import DevCluster
from arranger.client.sdk import ArrangerError, AsyncClient
from tests.client.test_cli import arranger
from tests.conftest import job_spec, script

LEARNER = """
import os
for key in ("ARRANGER_NUM_WORKERS", "ARRANGER_ROLE", "ARRANGER_WORKER_RANK", "ARRANGER_LEADER_ADDR"):
    print(key, os.environ[key], flush=True)
"""


async def test_a_lone_learner_runs_and_succeeds(
    cluster: DevCluster, client: AsyncClient, tmp_path: Path
) -> None:
    spec = job_spec("solo", leader=script(tmp_path, "learner", LEARNER))
    del spec["spec"]["workerSets"]
    job = await client.submit(spec)
    assert len(job.spec.worker_sets) == 0 and job.spec.min_workers_num == 0
    done = (await client.wait("solo", timeout_s=30)).status
    assert (done.stage, done.reason) == ("Succeeded", "LeaderSucceeded"), done.message
    assert list(done.workers) == [] and done.leader.exit_code == 0
    log = b"".join([c async for c in client.logs("solo")]).decode().splitlines()
    assert log[:3] == ["ARRANGER_NUM_WORKERS 0", "ARRANGER_ROLE leader", "ARRANGER_WORKER_RANK -1"]
    assert log[3] == f"ARRANGER_LEADER_ADDR {done.leader_address}"
    kinds = [e.kind for e in await client.events("solo")]
    assert "Running" in kinds and "Succeeded" in kinds
    assert (await client.explain("solo")).job.metadata.name == "solo"
    for args in (("get", "solo"), ("list", "--all"), ("explain", "solo")):
        code, out, err = await arranger(*args, server=cluster.address)
        assert code == 0 and "solo" in out, (args, out, err)


async def test_a_lone_learner_may_not_ask_for_workers(client: AsyncClient, tmp_path: Path) -> None:
    spec = job_spec("greedy", leader=["true"], minWorkersNum=1)
    spec["spec"]["workerSets"] = []
    with pytest.raises(ArrangerError, match=r"spec\.minWorkersNum: must be 0 for a job without"):
        await client.submit(spec)
