"""Elastic actors end to end: a learner scales its own job from inside it with the in-job SDK,
on a real server with real agents and processes on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path

from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from tests.conftest import eventually, job_spec, script

LEARNER = """
import json, os, pathlib, signal, sys
from arranger.job import current
out = pathlib.Path(os.environ["OUT"])
job = current()
job.scale("actors", 3)
members = job.members()
(out / "members.json").write_text(json.dumps([[m.name, m.rank, m.state] for m in members]))
signal.pause()
"""
ACTOR = """
import json, os, pathlib, signal
out = pathlib.Path(os.environ["OUT"])
env = {k: v for k, v in os.environ.items() if k.startswith("ARRANGER_")}
(out / (os.environ["ARRANGER_POD_NAME"] + ".json")).write_text(json.dumps(env))
signal.pause()
"""


async def test_a_learner_scales_its_own_actors_and_they_get_their_ranks(
    cluster: DevCluster, client: AsyncClient, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    learner, actor = script(tmp_path, "learner", LEARNER), script(tmp_path, "actor", ACTOR)
    spec = job_spec("el", learner, actor, workers=1, minWorkersNum=1)
    spec["spec"]["workerSets"][0]["maxCounts"] = 4
    for template in (spec["spec"]["leader"], spec["spec"]["workerSets"][0]):
        template["template"]["env"] = {"OUT": str(out)}
    await client.submit(spec)
    await eventually((out / "el-actors-2.json").exists, what="the third actor")
    env = json.loads((out / "el-actors-2.json").read_text())
    assert env["ARRANGER_WORKER_RANK"] == "2" and env["ARRANGER_NUM_WORKERS"] == "3"
    assert env["ARRANGER_JOB_TOKEN"].startswith("arj_") and env["ARRANGER_API"]
    job = await client.get("el")
    assert [ws.counts for ws in job.spec.worker_sets] == [3]
    await client.stop("el")
