"""Experiments end to end: a sweep submitted as one, on a real server with real agents
running real processes over gRPC on 127.0.0.1: its members' values reach their pods, at
most maxParallel run at once, it is listed folded, read, stopped and deleted as one, a job
may wait for it, and reported values are kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from arranger.client.sdk import AsyncClient
from arranger.client.specfile import load_job_data
from arranger.v1 import arranger_pb2, arranger_pb2_grpc, job_pb2
from tests.conftest import eventually, job_spec, script


def tyjob(doc: dict[str, Any]) -> job_pb2.TYJob:
    return load_job_data(doc)


@pytest.fixture
def stub(client: AsyncClient) -> arranger_pb2_grpc.ArrangerStub:
    """stub: the API as the local admin calls it (the client's credentials)."""
    return client._stubs[0]


def writer(tmp_path: Path) -> list[str]:
    """writer: a learner that writes what it was given to a file named by its index."""
    code = f"""
import os, sys
out = os.path.join({str(tmp_path)!r}, os.environ["ARRANGER_SWEEP_INDEX"])
given = {{k: v for k, v in os.environ.items() if k.startswith("ARRANGER_SWEEP_")}}
given["ARRANGER_EXPERIMENT"] = os.environ["ARRANGER_EXPERIMENT"]
given["argv"] = sys.argv[1:]
with open(out, "w") as f:
    f.write(__import__("json").dumps(given))
"""
    return script(tmp_path, "writer", code)


async def members_ended(stub: arranger_pb2_grpc.ArrangerStub, name: str) -> job_pb2.Experiment:
    exp = await stub.GetExperiment(arranger_pb2.GetExperimentRequest(name=name))
    ended = sum(exp.summary.stages[s] for s in ("Succeeded", "Failed"))
    return exp if ended == exp.summary.members else None  # type: ignore[return-value]


async def test_a_sweep_runs_each_member_with_its_values_at_most_max_parallel_at_once(
    stub: arranger_pb2_grpc.ArrangerStub, tmp_path: Path
) -> None:
    doc = job_spec("sweep", [*writer(tmp_path), "--lr={lr}", "{seed}", "${{HOME}}"])
    doc["spec"]["workerSets"] = []
    doc["spec"]["minWorkersNum"] = 0
    doc["spec"]["sweep"] = {"parameters": {"lr": [0.001, "3e-4"]}, "seeds": 2, "maxParallel": 2}
    reply = await stub.SubmitJob(arranger_pb2.SubmitJobRequest(job=tyjob(doc)))
    assert not reply.HasField("job")
    assert reply.experiment.name == "sweep" and reply.experiment.members == 4
    assert reply.experiment.stages["Pending"] == 4
    exp = await eventually(lambda: members_ended(stub, "sweep"), what="every member to end")
    assert exp.summary.outcomes["Completed"] == 4
    seen = {m.index: dict(m.values) for m in exp.members}
    assert seen == {
        0: {"lr": "0.001", "seed": "0"},
        1: {"lr": "0.001", "seed": "1"},
        2: {"lr": "3e-4", "seed": "0"},
        3: {"lr": "3e-4", "seed": "1"},
    }
    for index, values in seen.items():
        given = json.loads((tmp_path / str(index)).read_text())
        assert given["ARRANGER_SWEEP_LR"] == values["lr"]
        assert given["ARRANGER_SWEEP_SEED"] == values["seed"]
        assert given["ARRANGER_EXPERIMENT"] == "sweep"
        assert given["argv"] == [f"--lr={values['lr']}", values["seed"], "${{HOME}}"]
    # At most two ran at once: the third and fourth waited for their turn.
    history = await stub.ListHistory(arranger_pb2.ListHistoryRequest(experiment=exp.summary.id))
    assert sorted(r.name for r in history.records) == [f"sweep-{i}" for i in range(4)]
    spans = [(r.start_time.ToNanoseconds(), r.end_time.ToNanoseconds()) for r in history.records]
    for start, _ in spans:
        assert sum(1 for s, e in spans if s <= start < e) <= 2
    events = await stub.ListEvents(arranger_pb2.ListEventsRequest(limit=1000))
    turns = [e for e in events.events if e.kind == "TurnCame"]
    assert sorted(e.job for e in turns) == ["sweep-2", "sweep-3"]


async def test_a_job_waits_for_every_member_of_an_experiment(
    stub: arranger_pb2_grpc.ArrangerStub, tmp_path: Path
) -> None:
    """A job that depends on an experiment starts once every member succeeded; one that
    waits for it to succeed fails, never started, once a member failed."""
    code = "import os, sys; sys.exit(int(os.environ['ARRANGER_SWEEP_CODE']))"
    doc = job_spec("codes", ["python", "-c", code])
    doc["spec"] |= {"workerSets": [], "minWorkersNum": 0, "restartLimit": 0}
    doc["spec"]["sweep"] = {"parameters": {"code": [0, 1]}}
    exp = (await stub.SubmitJob(arranger_pb2.SubmitJobRequest(job=tyjob(doc)))).experiment
    after = job_spec("after", ["true"])
    after["spec"] |= {"workerSets": [], "minWorkersNum": 0}
    after["spec"]["dependsOn"] = [{"job": "codes", "when": "succeeded"}]
    anyway = job_spec("anyway", ["true"])
    anyway["spec"] |= {"workerSets": [], "minWorkersNum": 0}
    anyway["spec"]["dependsOn"] = [{"job": exp.id, "when": "finished"}]
    for job in (after, anyway):
        await stub.SubmitJob(arranger_pb2.SubmitJobRequest(job=tyjob(job)))
    waiting = await stub.GetJob(arranger_pb2.GetJobRequest(name="after"))
    assert waiting.status.reason in ("WaitingForDependencies", "DependencyNeverMet")

    async def ended(name: str) -> job_pb2.TYJob | None:
        job = await stub.GetJob(arranger_pb2.GetJobRequest(name=name))
        return job if job.status.stage in ("Succeeded", "Failed") else None

    never = await eventually(lambda: ended("after"), what="after to end")
    assert never.status.reason == "DependencyNeverMet"
    assert "experiment codes" in never.status.message and "ended Failed" in never.status.message
    assert not never.status.HasField("start_time")
    ran = await eventually(lambda: ended("anyway"), what="anyway to run")
    assert ran.status.stage == "Succeeded" and ran.status.HasField("start_time")
