"""Reported values end to end: real processes, run by real agents, report through the in-job
SDK (arranger.job) and read their experiment; the server keeps the latest values and notes,
a bounded history of each key, refuses a key past a job's limit naming the rule, and keeps it
all over a restart, while the SDK keeps what the server could not take."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import arranger
from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from arranger.client.specfile import load_job_data
from arranger.server.app import ArrangerServer
from arranger.v1 import arranger_pb2, arranger_pb2_grpc, job_pb2
from tests.conftest import Gate, eventually, job_spec, script

REPO = str(Path(arranger.__file__).parents[1])  # the code under test, for the pods

MEMBER = """
import json, os, pathlib, socket, grpc
from arranger.job import current
out, index = pathlib.Path(os.environ["OUT"]), int(os.environ["ARRANGER_SWEEP_INDEX"])
seen = {}
with current(report_interval_s=0.2) as job:
    for step in range(300):
        job.report(step, loss=1.0 / (step + 1), index=float(index))
    job.publish(checkpoint=f"/ckpt/{index}/250")
    job.publish(checkpoint=f"/ckpt/{index}/299")  # the latest is kept
    job.flush()
    try:
        job.report(300, **{f"k{i}": 1.0 for i in range(63)})
    except ValueError as exc:
        seen["here"] = str(exc)
    if index == 0:  # a second Job knows nothing of the 2 keys reported: the server counts them
        with current() as again:
            again.report(300, **{f"extra{i}": 1.0 for i in range(63)})
            try:
                again.flush()
                seen["refused"] = "OK"
            except grpc.RpcError as exc:
                seen["refused"] = f"{exc.code().name}: {exc.details()}"
            seen["dropped"] = again.reports_dropped
    (out / f"{index}.reported").write_text("")
    socket.create_connection(("127.0.0.1", int(os.environ["GATE"]))).recv(1)
    seen["experiment"] = job.experiment().name
    seen["peers"] = [[p.name, p.index, p.values, p.step, p.latest, p.notes] for p in job.peers()]
(out / f"{index}.json").write_text(json.dumps(seen))
"""


def pod(tmp_path: Path, name: str, code: str, env: dict[str, str]) -> dict[str, Any]:
    """pod: a job of one leader (no workers) running `code` with the SDK under test."""
    doc = job_spec(name, script(tmp_path, name, code))
    doc["spec"]["workerSets"] = []
    doc["spec"]["minWorkersNum"] = 0
    doc["spec"]["leader"]["template"]["env"] = {"PYTHONPATH": REPO, **env}
    return doc


async def log_of(client: AsyncClient, job: str) -> str:
    return b"".join([c async for c in client.logs(job)]).decode()


async def test_members_report_and_publish_and_read_each_others_latest(
    client: AsyncClient, tmp_path: Path, gate: Gate
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    doc = pod(tmp_path, "rep", MEMBER, {"OUT": str(out), "GATE": str(gate.port)})
    doc["spec"]["sweep"] = {"parameters": {"lr": [0.1, 0.2]}}
    stub: arranger_pb2_grpc.ArrangerStub = client._stubs[0]
    reply = await stub.SubmitJob(arranger_pb2.SubmitJobRequest(job=load_job_data(doc)))
    assert reply.experiment.members == 2

    def reported() -> bool:
        return all((out / f"{i}.reported").exists() for i in range(2))

    await eventually(reported, what="both members to report")
    exp = await stub.GetExperiment(arranger_pb2.GetExperimentRequest(name="rep"))
    members = {m.index: m for m in exp.members}
    for i, member in members.items():
        assert member.step == 299, member
        assert dict(member.latest) == {"loss": 1.0 / 300, "index": float(i)}
        assert dict(member.notes) == {"checkpoint": f"/ckpt/{i}/299"}

    # Each key keeps at most 256 points of its 300, thinned, the newest always kept.
    reports = await stub.GetReports(arranger_pb2.GetReportsRequest(name="rep"))
    assert sorted(r.job for r in reports.jobs) == ["rep-0", "rep-1"]
    for job in reports.jobs:
        series = {s.key: s for s in job.series}
        assert sorted(series) == ["index", "loss"]  # the refused extra keys are not kept
        loss = series["loss"]
        assert 128 <= len(loss.steps) <= 256 and len(loss.values) == len(loss.steps)
        assert loss.steps[0] == 0 and loss.steps[-1] == 299 and loss.values[-1] == 1.0 / 300
        assert list(loss.steps) == sorted(set(loss.steps))
        assert all(v == 1.0 / (s + 1) for s, v in zip(loss.steps, loss.values, strict=True))
        assert dict(job.notes) == {"checkpoint": f"/ckpt/{job.job[-1]}/299"}
    one = await stub.GetReports(arranger_pb2.GetReportsRequest(name="rep-1", keys=["loss"]))
    assert [(r.job, [s.key for s in r.series]) for r in one.jobs] == [("rep-1", ["loss"])]

    gate.open()
    await eventually(lambda: completed(stub, "rep"), what="both members to complete")
    seen = [json.loads((out / f"{i}.json").read_text()) for i in range(2)]

    # The 64 keys rule: this program's own 65th key is refused at once, before it is sent; a
    # 65th the server counts (of another Job of the same pod) is refused by it, naming it.
    for told in seen:
        assert told["here"] == "a job reports at most 64 keys; 'k0' would pass it", told
    assert seen[0]["refused"].startswith(
        "RESOURCE_EXHAUSTED: points: a job reports at most 64 keys; "
    ), seen[0]
    assert seen[0]["dropped"] == 1
    for i, told in enumerate(seen):
        other = 1 - i
        assert told["experiment"] == "rep"
        assert told["peers"] == [
            [
                f"rep-{other}",
                other,
                {"lr": ["0.1", "0.2"][other], "seed": "0"},
                299,
                {"loss": 1.0 / 300, "index": float(other)},
                {"checkpoint": f"/ckpt/{other}/299"},
            ]
        ], told


async def completed(stub: arranger_pb2_grpc.ArrangerStub, name: str) -> job_pb2.Experiment | None:
    """completed: the experiment once every member has completed; a failed one fails the
    test, with its log."""
    exp = await stub.GetExperiment(arranger_pb2.GetExperimentRequest(name=name))
    assert exp.summary.outcomes["Failed"] == 0, exp
    return exp if exp.summary.outcomes["Completed"] == exp.summary.members else None


THROUGH_A_RESTART = """
import json, os, pathlib, socket, grpc
from arranger.job import NotInExperiment, current
out = pathlib.Path(os.environ["OUT"])

def wait(gate):
    socket.create_connection(("127.0.0.1", int(os.environ[gate]))).recv(1)

seen = {}
with current(report_interval_s=0.1) as job:
    try:
        job.peers()
    except NotInExperiment as exc:
        seen["peers"] = str(exc)
    for step in range(10):
        job.report(step, x=float(step))
    job.publish(checkpoint="/ckpt/9")
    job.flush()
    (out / "first").write_text("")
    wait("DOWN")  # the server has stopped
    for step in range(10, 20):
        job.report(step, x=float(step))
    job.publish(checkpoint="/ckpt/19")
    try:
        job.flush(timeout_s=2)
    except grpc.RpcError as exc:
        seen["down"] = exc.code().name
    seen["dropped"] = job.reports_dropped
    (out / "second").write_text(json.dumps(seen))
    wait("BACK")  # a new server took what the reporting thread kept
    job.flush()
"""


async def test_values_survive_a_server_restart_and_what_it_could_not_take_is_sent_after(
    cluster: DevCluster, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    async with Gate() as down, Gate() as back:
        env = {"OUT": str(out), "DOWN": str(down.port), "BACK": str(back.port)}
        async with AsyncClient(cluster.address) as client:
            job = await client.submit(pod(tmp_path, "rs", THROUGH_A_RESTART, env))
        await eventually((out / "first").exists, what="the first reports")

        old = cluster.server
        await old.stop()
        down.open()
        await eventually((out / "second").exists, what="reports made while it is down")
        cluster.serve_with(
            ArrangerServer(dataclasses.replace(old.config, listen=f"127.0.0.1:{old.port}"))
        )
        await cluster.server.start()

        async with AsyncClient(cluster.address) as client:
            stub: arranger_pb2_grpc.ArrangerStub = client._stubs[0]

            async def series() -> arranger_pb2.GetReportsResponse | None:
                got = await stub.GetReports(arranger_pb2.GetReportsRequest(name="rs"))
                steps = [list(s.steps) for r in got.jobs for s in r.series]
                return got if steps == [list(range(20))] else None

            got = await eventually(series, what="every point, kept over the restart")
            (reports,) = got.jobs
            assert reports.id == job.metadata.id
            assert list(reports.series[0].values) == [float(s) for s in range(20)]
            assert dict(reports.notes) == {"checkpoint": "/ckpt/19"}
            back.open()
            done = await client.wait("rs", timeout_s=30)
            assert done.status.stage == "Succeeded", await log_of(client, "rs")
            again = await stub.GetReports(arranger_pb2.GetReportsRequest(name="rs"))
            assert again == got  # an ended job's reports are kept

    seen = json.loads((out / "second").read_text())
    assert seen["down"] == "UNAVAILABLE" and seen["dropped"] == 0, seen
    assert seen["peers"].endswith("is no member of an experiment (no sweep)"), seen


WITHOUT_CLOSE = """
from arranger.job import current
job = current(report_interval_s=3600)  # the reporting thread never sends: the exit does
job.report(7, x=7.0)
job.publish(checkpoint="/ckpt/7")
"""


async def test_a_program_that_ends_without_closing_its_job_sends_what_it_reported(
    client: AsyncClient, tmp_path: Path
) -> None:
    await client.submit(pod(tmp_path, "quick", WITHOUT_CLOSE, {}))
    done = await client.wait("quick", timeout_s=30)
    assert done.status.stage == "Succeeded", await log_of(client, "quick")
    stub: arranger_pb2_grpc.ArrangerStub = client._stubs[0]
    (reports,) = (await stub.GetReports(arranger_pb2.GetReportsRequest(name="quick"))).jobs
    assert [(s.key, list(s.steps), list(s.values)) for s in reports.series] == [("x", [7], [7.0])]
    assert dict(reports.notes) == {"checkpoint": "/ckpt/7"}
