"""Experiments on a real server without agents (nothing runs): admission of a sweep and what
it refuses, members held past maxParallel (and again after a restart), the folded listing,
stop and delete as one, and a job that waits for an experiment."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from arranger.client.sdk import AsyncClient
from arranger.client.specfile import load_job_data
from arranger.sched import SchedulerConfig
from arranger.server.app import ArrangerServer
from arranger.server.experiments import TURN
from arranger.server.limits import UserLimits
from arranger.server.store import Batch, StoreError
from arranger.v1 import arranger_pb2, job_pb2
from tests.conftest import FAST, bare_server, job_spec

# No node ever joins these servers: jobs wait for one (FAST's 0.5 s would fail them).
WAITS = dataclasses.replace(FAST, scheduler=SchedulerConfig(infeasible_timeout_s=3600))


def sweep(
    name: str, parameters: dict[str, list[Any]], seeds: int = 1, **more: Any
) -> job_pb2.TYJob:
    doc = job_spec(name, ["python", "-c", "pass"])
    doc["spec"]["workerSets"] = []
    doc["spec"]["minWorkersNum"] = 0
    doc["spec"]["sweep"] = {"parameters": parameters, "seeds": seeds, **more}
    return load_job_data(doc)


async def submit(client: AsyncClient, job: job_pb2.TYJob) -> arranger_pb2.SubmitJobResponse:
    return await client._stubs[0].SubmitJob(
        arranger_pb2.SubmitJobRequest(job=job, queue_anyway=True)
    )


async def refused(client: AsyncClient, job: job_pb2.TYJob) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await submit(client, job)
    return caught.value


def held(server: ArrangerServer, name: str) -> list[int]:
    """held: the indexes of the experiment's members held for their turn."""
    exp = server.controller.view.experiment(name)
    assert exp is not None
    return [
        i
        for i, job in enumerate(server.controller.view.members(exp))
        if job.waiting and job.reason == TURN
    ]


async def test_members_past_max_parallel_are_held_and_stay_held_after_a_restart(
    tmp_path: Path,
) -> None:
    config = dataclasses.replace(WAITS, listen="127.0.0.1:0", data_dir=tmp_path)
    async with (
        bare_server(tmp_path, config) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        reply = await submit(client, sweep("grid", {"lr": [1, 2, 3]}, seeds=2, maxParallel=2))
        assert reply.experiment.members == 6
        assert held(server, "grid") == [2, 3, 4, 5]
        member = await client.get("grid-4")
        assert member.status.reason == TURN and "at most 2 members" in member.status.message
        explained = await client.explain("grid-4")
        assert explained.decision or explained.message  # held: no placement is tried
        exp_id = reply.experiment.id
    async with (
        bare_server(tmp_path, config) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        assert held(server, "grid") == [2, 3, 4, 5]
        exp = await client._stubs[0].GetExperiment(arranger_pb2.GetExperimentRequest(name=exp_id))
        assert [m.index for m in exp.members] == list(range(6))
        assert dict(exp.members[5].values) == {"lr": "3", "seed": "1"}
        # Stopped, the held members never start; the experiment ends with them.
        stopped = await client._stubs[0].StopExperiment(
            arranger_pb2.StopExperimentRequest(name="grid")
        )
        assert stopped.name == "grid"
        assert held(server, "grid") == []
        for i in range(2, 6):
            job = await client.get(f"grid-{i}")
            assert job.status.stage == "Succeeded" and job.status.reason == "Stopped"
            assert not job.status.HasField("start_time")


async def test_a_folded_listing_shows_an_experiment_as_one_line(tmp_path: Path) -> None:
    async with (
        bare_server(tmp_path, WAITS) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        await submit(client, sweep("folded", {"lr": [1, 2]}, seeds=3))
        await client.submit(job_spec("alone", ["true"]), queue_anyway=True)
        stub = client._stubs[0]
        plain = await stub.ListJobs(arranger_pb2.ListJobsRequest())
        assert len(plain.jobs) == 7 and not plain.experiments
        assert {j.experiment for j in plain.jobs} == {"folded", ""}
        folded = await stub.ListJobs(arranger_pb2.ListJobsRequest(fold=True))
        assert [j.name for j in folded.jobs] == ["alone"]
        (exp,) = folded.experiments
        assert exp.name == "folded" and exp.members == 6 and exp.stages["Pending"] == 6
        assert list(exp.parameters) == ["lr"] and exp.seeds == 3
        one = await stub.ListJobs(arranger_pb2.ListJobsRequest(experiment="folded", page_size=4))
        assert [j.name for j in one.jobs] == [f"folded-{i}" for i in range(4)]
        rest = await stub.ListJobs(
            arranger_pb2.ListJobsRequest(experiment="folded", page_token=one.next_page_token)
        )
        assert [j.name for j in rest.jobs] == ["folded-4", "folded-5"]


async def test_names_are_one_namespace_and_a_deleted_experiment_frees_its_name(
    tmp_path: Path,
) -> None:
    async with (
        bare_server(tmp_path, WAITS) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        await submit(client, sweep("taken", {"lr": [1, 2]}))
        again = await refused(client, sweep("taken", {"lr": [3]}))
        assert again.code() == grpc.StatusCode.ALREADY_EXISTS
        assert "metadata.name: experiment 'taken'" in (again.details() or "")
        job = await refused(client, load_job_data(job_spec("taken", ["true"])))
        assert job.code() == grpc.StatusCode.ALREADY_EXISTS
        await client.submit(job_spec("clash-1", ["true"]), queue_anyway=True)
        clash = await refused(client, sweep("clash", {"lr": [1, 2]}))
        assert "member 1 would be named 'clash-1'" in (clash.details() or "")
        await client._stubs[0].DeleteExperiment(arranger_pb2.DeleteExperimentRequest(name="taken"))
        with pytest.raises(grpc.aio.AioRpcError) as gone:
            await client._stubs[0].GetExperiment(arranger_pb2.GetExperimentRequest(name="taken"))
        assert gone.value.code() == grpc.StatusCode.NOT_FOUND
        reply = await submit(client, sweep("taken", {"lr": [3]}))
        assert reply.experiment.members == 1 and server.controller.view.find("taken-0")


async def test_a_sweep_is_held_to_the_limits_naming_them(tmp_path: Path) -> None:
    limits = UserLimits(jobs_per_user=10, members_per_experiment=8)
    config = dataclasses.replace(WAITS, limits=limits)
    async with (
        bare_server(tmp_path, config) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        many = await refused(client, sweep("many", {"lr": [1, 2, 3]}, seeds=3))
        assert many.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "limits.membersPerExperiment: spec.sweep makes 9 members" in (many.details() or "")
        await submit(client, sweep("six", {"lr": [1, 2, 3]}, seeds=2))
        over = await refused(client, sweep("five", {"lr": [1, 2, 3, 4, 5]}))
        assert "limits.jobsPerUser" in (over.details() or "") and "5 more" in (over.details() or "")
        for bad, field in (
            ({"parameters": {"Bad": [1]}}, "spec.sweep.parameters.Bad"),
            ({"parameters": {"seed": [1]}}, "spec.sweep.parameters.seed"),
            ({"parameters": {"lr": []}}, "spec.sweep.parameters.lr"),
            ({"parameters": {"lr": [1, 1]}}, "spec.sweep.parameters.lr"),
            ({"parameters": {"lr": [{"a": 1}]}}, "spec.sweep.parameters.lr"),
            ({"parameters": {"lr": [1]}, "seeds": 0}, "spec.sweep.seeds"),
            ({"parameters": {"lr": [1]}, "maxParallel": -1}, "spec.sweep.maxParallel"),
            ({"parameters": {"lr": [1]}, "member": 3}, "spec.sweep.member"),
        ):
            job = load_job_data(job_spec("bad", ["true"]))
            json_format.ParseDict({"sweep": bad}, job.spec)  # as sent: past the client's checks
            wrong = await refused(client, job)
            assert wrong.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert (wrong.details() or "").startswith(field), wrong.details()
        long = await refused(client, sweep("n" * 47, {"lr": list(range(10))}))
        assert (long.details() or "").startswith("metadata.name: members are named")


async def test_a_refused_write_leaves_the_experiment_as_stored(tmp_path: Path) -> None:
    """A submit whose write the store refuses leaves no member nor name behind; a delete
    whose write is refused leaves the experiment named, its members held as before."""
    async with (
        bare_server(tmp_path, WAITS) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        store = server.store
        real = store._commit
        refuse = [True]

        async def refusing(batch: Batch) -> None:
            if refuse[0]:
                raise StoreError("disk full")
            await real(batch)

        store._commit = refusing  # type: ignore[method-assign]
        lost = await refused(client, sweep("lost", {"lr": [1, 2]}, maxParallel=1))
        assert lost.code() == grpc.StatusCode.UNAVAILABLE
        view = server.controller.view
        assert view.experiment("lost") is None and view.find("lost-0") is None
        assert not server.controller.experiments and not server.controller.waiting
        refuse[0] = False
        await submit(client, sweep("kept", {"lr": [1, 2, 3]}, maxParallel=1))
        refuse[0] = True
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client._stubs[0].DeleteExperiment(
                arranger_pb2.DeleteExperimentRequest(name="kept")
            )
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        exp = view.experiment("kept")
        assert exp is not None and not any(j.deleted for j in view.members(exp))
        assert held(server, "kept") == [1, 2]


async def test_a_name_means_the_newest_of_its_jobs_and_experiments(tmp_path: Path) -> None:
    """A job that ended and an experiment of its name submitted later: the name means the
    experiment (the job by its id only), for the CLI's get, stop, delete alike."""
    async with (
        bare_server(tmp_path, WAITS) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        old = await client.submit(job_spec("twice", ["true"]), queue_anyway=True)
        await client.stop("twice")
        await submit(client, sweep("twice", {"lr": [1]}))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client._stubs[0].GetJob(arranger_pb2.GetJobRequest(name="twice"))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert "the name means experiment twice" in (caught.value.details() or "")
        assert (await client.get(old.metadata.id)).metadata.id == old.metadata.id
        assert server.controller.view.experiment("twice") is not None
