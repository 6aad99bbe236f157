"""Reports racing each other and their job's end: a report that waited for its job's lock
while the job was deleted is refused, and no write is refused with it (its row would name a
job the store no longer holds); reports of one job are taken one at a time, so none is lost
though each caller is answered OK."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import grpc

from arranger.client.sdk import AsyncClient
from arranger.server.store import Batch
from arranger.v1 import arranger_pb2
from tests.conftest import bare_server, eventually, job_spec
from tests.server.test_experiments import WAITS


def point(step: int) -> arranger_pb2.ReportValuesRequest:
    return arranger_pb2.ReportValuesRequest(
        points=[arranger_pb2.ReportPoint(step=step, values={"loss": 1.0})]
    )


async def test_a_report_racing_a_delete_refuses_no_write(tmp_path: Path, store_url: str) -> None:
    config = dataclasses.replace(WAITS, store=store_url)
    async with (
        bare_server(tmp_path, config) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        stub = client._stubs[0]
        await client.submit(job_spec("j", ["true"]), queue_anyway=True)
        await client.submit(job_spec("k", ["true"]), queue_anyway=True)
        job_id = server.controller.view.find("j").id
        store, real = server.store, server.store._commit
        entered, release = asyncio.Event(), asyncio.Event()

        async def held(batch: Batch) -> None:
            if not entered.is_set():  # the first write (k's report) waits for the test
                entered.set()
                await release.wait()
            await real(batch)

        store._commit = held  # type: ignore[method-assign]

        def report(name: str, step: int) -> asyncio.Task[object]:
            request = point(step)
            request.job = name
            return asyncio.ensure_future(stub.ReportValues(request))

        first_write = report("k", 1)
        await eventually(entered.is_set, what="k's report to be writing")
        r1 = report("j", 1)  # takes j's lock, queued behind k's write
        await eventually(lambda: server.reports.lock(job_id).locked(), what="r1 to hold j's lock")
        r2 = report("j", 2)  # active now; waits for j's lock
        await eventually(
            lambda: bool(getattr(server.reports.lock(job_id), "_waiters", None)),
            what="r2 to wait for j's lock",
        )
        deleted = asyncio.ensure_future(stub.DeleteJob(arranger_pb2.DeleteJobRequest(name="j")))
        await eventually(lambda: len(server.changes.writes._queued) >= 2, what="r1 and delete")
        release.set()
        await first_write
        await r1
        await deleted
        outcome = await asyncio.gather(r2, return_exceptions=True)
        assert server.controller.view.job(job_id) is None  # reaped
        failures = server.store_health.failures
        codes = [o.code() for o in outcome if isinstance(o, grpc.aio.AioRpcError)]
        assert failures == 0 and grpc.StatusCode.UNAVAILABLE not in codes, (
            f"a report racing a delete made the store refuse a write: {outcome}; "
            f"health writable={server.store_health.writable}"
        )


async def test_three_reports_of_one_job_keep_every_point(tmp_path: Path) -> None:
    """ReportBook.release drops a job's lock when `locked()` is False - which it is between
    one holder's release and the waiter's wake-up. The next report then makes a new lock and
    runs beside the waiter: both build on the same stored state, and the later write drops
    the other's points (each caller was answered OK)."""
    async with (
        bare_server(tmp_path, WAITS) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        stub = client._stubs[0]
        await client.submit(job_spec("j", ["true"]), queue_anyway=True)
        job_id = server.controller.view.find("j").id
        store, real = server.store, server.store._commit
        gates = [asyncio.Event(), asyncio.Event()]
        entered = [asyncio.Event(), asyncio.Event()]
        writes = [0]

        async def held(batch: Batch) -> None:
            n = writes[0]
            writes[0] += 1
            if n < 2 and batch.report_points:
                entered[n].set()
                await gates[n].wait()
            await real(batch)

        store._commit = held  # type: ignore[method-assign]

        def report(step: int) -> asyncio.Future[object]:
            request = point(step)
            request.job = "j"
            return asyncio.ensure_future(stub.ReportValues(request))

        r1 = report(1)
        await eventually(entered[0].is_set, what="r1 writing")
        r2 = report(2)
        await eventually(
            lambda: bool(getattr(server.reports.lock(job_id), "_waiters", None)),
            what="r2 waiting for j's lock",
        )
        gates[0].set()
        await r1
        await eventually(entered[1].is_set, what="r2 writing")
        r3 = report(3)  # r2 holds the lock it waited for; is r3 kept out?

        def r3_placed() -> bool:  # r3 waits for the lock r2 holds (right), or writes (wrong)
            lock = server.reports._locks.get(job_id)
            waiting = lock is not None and bool(getattr(lock, "_waiters", None))
            return waiting or len(server.changes.writes._queued) > 0

        await eventually(r3_placed, what="r3 to wait for the lock or to write")
        gates[1].set()
        await asyncio.gather(r2, r3)
        reply = await stub.GetReports(arranger_pb2.GetReportsRequest(name="j"))
        steps = list(reply.jobs[0].series[0].steps)
        assert steps == [1, 2, 3], f"every report answered OK, yet the kept steps are {steps}"
