"""ListJobs on a real server over gRPC: summaries, paging, owner filters, and a listing whose
cost follows the page, not the number or size of the jobs (100,000 jobs; jobs at the spec cap).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import grpc
import pytest

from arranger.client.sdk import ArrangerError, AsyncClient, as_job
from arranger.server.app import ArrangerServer
from arranger.server.controller import Controller
from arranger.server.convert import spec_to_json
from arranger.server.listing import JobOrder
from arranger.server.model import JobRecord
from arranger.server.spec_bounds import BOUNDS
from arranger.server.validation import parse_job
from arranger.states import PodState, Stage
from arranger.v1 import arranger_pb2, arranger_pb2_grpc, job_pb2
from tests.client.test_cli import arranger
from tests.conftest import FAST, bare_server, job_spec

MANY = 100_000
QUIET = dataclasses.replace(FAST, schedule_period_s=3600.0)  # no cycles over 100,000 jobs


def fill(controller: Controller, count: int, owners: tuple[str, ...]) -> None:
    """fill submits `count` finished jobs through the controller, as the API would have (the
    store is not written: this is what the server holds, not what it reloads), owned in turn
    by `owners`; every tenth Failed, the rest Succeeded."""
    spec = parse_job(as_job(job_spec("base", leader=["python", "learn.py"], workers=1)))
    text = spec_to_json(spec)
    for i in range(count):
        named = dataclasses.replace(spec, name=f"job-{i:06d}")
        job, _ = controller.submit(f"{i:012x}", named, text, 1.7e9 + i, owners[i % len(owners)])
        job.stage = Stage.FAILED if i % 10 == 0 else Stage.SUCCEEDED
        for pod in job.pods.values():
            pod.state, pod.done = PodState.SUCCEEDED, True


@pytest.mark.timeout(600)
async def test_a_hundred_thousand_jobs_list_through_the_sdk_and_the_cli(tmp_path: Path) -> None:
    server = ArrangerServer(dataclasses.replace(QUIET, listen="127.0.0.1:0", data_dir=tmp_path))
    owners = ("alice", "bob", server.local.user)
    fill(server.controller, MANY, owners)
    async with (
        bare_server(tmp_path, server=server),
        AsyncClient(f"127.0.0.1:{server.port}", timeout_s=60) as client,
    ):
        started = time.perf_counter()
        names = [job.name async for job in client.iter_jobs()]
        default_pages_s = time.perf_counter() - started
        assert names == [f"job-{i:06d}" for i in range(MANY)]
        started = time.perf_counter()
        assert len([job async for job in client.iter_jobs(page_size=5000)]) == MANY
        big_pages_s = time.perf_counter() - started

        bobs = await client.jobs(owner="bob")
        assert [j.name for j in bobs] == [f"job-{i:06d}" for i in range(1, MANY, 3)]
        assert {j.owner for j in bobs} == {"bob"}
        mine = await client.jobs(mine=True, stages=["Failed"])
        assert [j.name for j in mine] == [f"job-{i:06d}" for i in range(2, MANY, 3) if i % 10 == 0]

        address = f"127.0.0.1:{server.port}"
        started = time.perf_counter()
        rc, out, err = await arranger("list", "--all", server=address)
        cli_s = time.perf_counter() - started
        lines = out.splitlines()
        assert rc == 0, err
        assert lines[0].split() == [
            "NAME",
            "ID",
            "OWNER",
            "QUEUE",
            "PRI",
            "STAGE",
            "OUTCOME",
            "SCHEDULE",
            "WORKERS",
            "RESTARTS",
            "AGE",
            "MESSAGE",
        ]
        assert len(lines) == MANY + 1
        assert lines[1].split()[:1] + lines[1].split()[2:6] == [
            "job-000000",
            "alice",
            "default",
            "5",
            "Failed",
        ]
        assert lines[-1].split()[:1] + lines[-1].split()[2:6] == [
            f"job-{MANY - 1:06d}",
            "alice",
            "default",
            "5",
            "Succeeded",
        ]
        rc, out, err = await arranger(
            "list", "--all", "--user", "alice", "-o", "json", server=address
        )
        listed = json.loads(out)
        assert rc == 0 and len(listed) == len(range(0, MANY, 3)), err
        assert {j["owner"] for j in listed} == {"alice"} and "spec" not in listed[0]
        rc, out, err = await arranger("list", "--mine", "--stage", "Failed", server=address)
        assert rc == 0 and len(out.splitlines()) == len(mine) + 1, err
        rc, _, err = await arranger("list", "--mine", "--user", "bob", server=address)
        assert rc == 2 and "not allowed with argument" in err
    print(
        f"\n{MANY} jobs: SDK list {default_pages_s:.2f} s (pages of 500), "
        f"{big_pages_s:.2f} s (pages of 5000); `arranger list` {cli_s:.2f} s"
    )


async def test_jobs_at_the_spec_cap_list_in_one_page(tmp_path: Path) -> None:
    """Six jobs of about 1 MiB each (the spec cap): whole, they would be a reply of 6 MiB, over
    the 4 MiB a client takes; as summaries they are a few hundred bytes each."""
    async with bare_server(tmp_path) as server:
        cap = server.config.limits.spec_bytes
        address = f"127.0.0.1:{server.port}"
        async with AsyncClient(address) as client:
            for i in range(6):
                job = capped_job(f"big-{i}", cap)
                assert cap - 4096 < job.ByteSize() <= cap
                await client.submit(job)
            jobs = await client.jobs()
            assert [j.name for j in jobs] == [f"big-{i}" for i in range(6)]
            assert all(j.ByteSize() < 1024 for j in jobs)
            assert jobs[0].pods == 6 and jobs[0].workers == 5
            assert jobs[0].requested.cpu == pytest.approx(0.6)
            assert jobs[0].requested.memory == 6 * 64 * 2**20
        rc, out, err = await arranger("list", "--all", server=address)
        assert rc == 0 and [line.split()[0] for line in out.splitlines()[1:]] == [
            f"big-{i}" for i in range(6)
        ], err


def capped_job(name: str, cap: int) -> job_pb2.TYJob:
    """capped_job: a job of 1 leader and 5 worker sets whose environment values and arguments
    make its whole spec just under `cap` bytes (each template within its own limits)."""
    job = as_job(job_spec(name, leader=["python", "learn.py"]))
    for i in range(1, 5):
        job.spec.worker_sets.add().CopyFrom(job.spec.worker_sets[0])
        job.spec.worker_sets[i].name = f"set{i}"
    templates = [job.spec.leader.template, *(ws.template for ws in job.spec.worker_sets)]
    for template in templates:
        for k in range(BOUNDS.env_bytes // 1024 - 1):
            template.env[f"V{k}"] = "e" * 1000
    while job.ByteSize() + 1100 < cap:
        template = min(templates, key=lambda t: sum(len(a) for a in t.args))
        assert sum(len(a) for a in template.args) + 1000 < BOUNDS.argv_bytes
        template.args.append("a" * 1000)
    return job


async def test_pages_are_complete_and_ordered_while_jobs_are_submitted(tmp_path: Path) -> None:
    async with bare_server(tmp_path) as server, AsyncClient(f"127.0.0.1:{server.port}") as client:
        submitted = []
        for i in range(7):
            submitted.append((await client.submit(job_spec(f"first-{i}", ["true"]))).metadata.name)
        seen: list[str] = []
        token, batch, deleted = "", 0, ""
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
        stub = arranger_pb2_grpc.ArrangerStub(channel)
        try:
            while True:
                request = arranger_pb2.ListJobsRequest(page_size=3, page_token=token)
                page = await stub.ListJobs(request, timeout=10)
                seen += [j.name for j in page.jobs]
                token = page.next_page_token
                if not token:
                    break
                for _ in range(2):  # between pages: two more, which sort after every other
                    name = f"later-{batch}"
                    batch += 1
                    submitted.append((await client.submit(job_spec(name, ["true"]))).metadata.name)
                if batch == 6:
                    await client.delete(seen[0])  # and one already listed goes away
                    await client.delete(submitted[len(seen)])  # and one not yet listed
                    deleted = submitted[len(seen)]
            assert seen == [n for n in submitted if n != deleted]

            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await stub.ListJobs(arranger_pb2.ListJobsRequest(page_token="nonsense"))
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert (bad.value.details() or "").startswith("pageToken: ")
        finally:
            await channel.close()
        with pytest.raises(ArrangerError) as both:
            await client.jobs(owner="bob", mine=True)
        assert both.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_a_submit_on_a_clock_that_stands_still_sorts_last() -> None:
    controller = Controller()
    spec = parse_job(as_job(job_spec("x", ["true"])))
    ids = ["f", "a", "c"]  # a later id is no later in listing order than a later submit
    for job_id in ids:
        controller.submit(job_id, dataclasses.replace(spec, name=f"j{job_id}"), "", 100.0)
    assert list(controller.order.after(None)) == ids
    assert list(controller.order.after((controller.jobs["a"].submit_time, "a"))) == ["c"]


def test_the_order_keeps_keys_sorted_overall_and_per_owner() -> None:
    order = JobOrder()
    jobs = {
        n: JobRecord(id=n, spec=None, spec_json="", submit_time=t, owner=o)  # type: ignore[arg-type]
        for n, t, o in [("x", 3.0, "al"), ("y", 1.0, "bo"), ("z", 2.0, "al"), ("w", 2.0, "bo")]
    }
    for job in jobs.values():
        order.add(job)
    assert list(order.after(None)) == ["y", "w", "z", "x"]
    assert list(order.after((2.0, "w"))) == ["z", "x"]
    assert list(order.after(None, "al")) == ["z", "x"] and list(order.after(None, "cy")) == []
    order.remove(jobs["z"])
    order.remove(jobs["z"])  # twice: nothing more happens
    assert list(order.after(None)) == ["y", "w", "x"] and list(order.after(None, "al")) == ["x"]
    assert order.newest() == (3.0, "x") and len(order) == 3
