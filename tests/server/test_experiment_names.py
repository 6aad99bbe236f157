"""A name means the newest of its jobs and experiments everywhere a name is resolved: a
call on a job, a dependency at admission, GetReports; and a member may not take the name of
an unfinished experiment."""

from __future__ import annotations

from pathlib import Path

from arranger.client.sdk import AsyncClient
from arranger.client.specfile import load_job_data
from arranger.v1 import arranger_pb2
from tests.conftest import bare_server, job_spec
from tests.server.test_experiments import WAITS, submit, sweep


async def test_depends_on_a_name_waits_for_the_newer_experiment_not_an_old_job(
    tmp_path: Path,
) -> None:
    async with (
        bare_server(tmp_path, WAITS) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        await client.submit(job_spec("train", ["true"]), queue_anyway=True)
        await client.stop("train")  # an old run, finished (Stopped)
        exp = (await submit(client, sweep("train", {"lr": [1, 2]}))).experiment
        after = job_spec("after", ["true"])
        after["spec"]["dependsOn"] = [{"job": "train", "when": "finished"}]
        await client._stubs[0].SubmitJob(
            arranger_pb2.SubmitJobRequest(job=load_job_data(after), queue_anyway=True)
        )
        job = server.controller.view.find("after")
        assert job.spec.depends_on[0].job == exp.id, (
            f"'train' resolved to the old job, not the experiment submitted after it: "
            f"after is {job.reason!r} ({job.message})"
        )


async def test_get_reports_of_a_name_reads_the_newer_experiment(tmp_path: Path) -> None:
    async with (
        bare_server(tmp_path, WAITS) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        stub = client._stubs[0]
        await client.submit(job_spec("train", ["true"]), queue_anyway=True)
        await client.stop("train")
        await submit(client, sweep("train", {"lr": [1, 2]}))
        for name in ("train-0", "train-1"):
            await stub.ReportValues(
                arranger_pb2.ReportValuesRequest(
                    job=name, points=[arranger_pb2.ReportPoint(step=1, values={"loss": 1.0})]
                )
            )
        reply = await stub.GetReports(arranger_pb2.GetReportsRequest(name="train"))
        assert sorted(r.job for r in reply.jobs) == ["train-0", "train-1"], reply


async def test_a_member_is_not_named_like_an_unfinished_experiment(tmp_path: Path) -> None:
    """Names are one namespace while unfinished (README): a job may not take the name of an
    unfinished experiment (names_taken refuses it), but a member may - names_taken looks only
    for unfinished *jobs* of each member's name. Then `t-1` means the member to GetJob,
    StopJob and dependsOn, and the experiment to GetExperiment."""
    async with (
        bare_server(tmp_path, WAITS) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        await submit(client, sweep("t-1", {"lr": [1, 2]}))
        job = load_job_data(job_spec("t-1", ["true"]))
        try:
            await client._stubs[0].SubmitJob(arranger_pb2.SubmitJobRequest(job=job))
            raise AssertionError("a job named like an unfinished experiment was taken")
        except Exception as exc:
            assert "ALREADY_EXISTS" in str(exc)
        try:
            await submit(client, sweep("t", {"lr": [1, 2]}))  # member 1 is `t-1`
        except Exception as exc:
            assert "ALREADY_EXISTS" in str(exc)
            return
        member = server.controller.view.find("t-1")
        raise AssertionError(
            f"member t-1 (experiment t) taken beside the unfinished experiment t-1: "
            f"find('t-1') is {member.id} of experiment {member.experiment}"
        )
