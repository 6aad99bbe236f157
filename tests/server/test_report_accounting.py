"""Reported values and limits.jobBytesPerUser, memory against the store: reports of a user's
jobs racing each other are charged before their writes, so they cannot pass the limit
together; a report whose caller gave up is kept whole (memory, store and charge agree); a
job's step reads the same after a restart."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from arranger.client.sdk import AsyncClient
from arranger.server.limits import UserLimits
from arranger.server.reports import MAX_POINTS, POINT_BYTES
from arranger.server.store import Batch
from arranger.v1 import arranger_pb2
from tests.conftest import bare_server, eventually, job_spec
from tests.server.test_experiments import WAITS
from tests.server.test_report_limits import full

LIMIT = 2 * 2**20


async def test_reports_of_many_jobs_racing_pass_job_bytes_per_user(tmp_path: Path) -> None:
    """Each report's bytes are charged before its write: reports of the owner's other jobs,
    made while one write is under way, see them."""
    config = dataclasses.replace(WAITS, limits=UserLimits(job_bytes_per_user=LIMIT))
    async with (
        bare_server(tmp_path, config) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        stub = client._stubs[0]
        for i in range(3):
            await client.submit(job_spec(f"r{i}", ["true"]), queue_anyway=True)
        store, real = server.store, server.store._commit
        entered, release = asyncio.Event(), asyncio.Event()

        async def held(batch: Batch) -> None:
            if not entered.is_set():
                entered.set()
                await release.wait()
            await real(batch)

        store._commit = held  # type: ignore[method-assign]
        first = asyncio.ensure_future(stub.ReportValues(full("r0")))
        await eventually(entered.is_set, what="r0's report to be writing")
        rest = [asyncio.ensure_future(stub.ReportValues(full(f"r{i}"))) for i in (1, 2)]
        await eventually(
            lambda: all(t.done() for t in rest) or len(server.changes.writes._queued) >= 2,
            what="r1 and r2 refused or queued",
        )
        release.set()
        outcome = await asyncio.gather(first, *rest, return_exceptions=True)
        points = sum(
            len(s.steps)
            for r in (await server.store.load_reports()).values()
            for s in r.series.values()
        )
        kept = server.submits._bytes.get("root", 0)
        assert points * POINT_BYTES <= LIMIT and kept <= LIMIT, (
            f"limit {LIMIT}: the store holds {points * POINT_BYTES} bytes of reports, the user "
            f"is charged {kept}; replies {[getattr(o, 'code', lambda: 'OK')() for o in outcome]}"
        )


async def test_a_cancelled_report_leaves_memory_and_charge_behind_the_store(
    tmp_path: Path,
) -> None:
    """A report whose caller gave up (a deadline, a cancel) while it was written is kept whole:
    in memory as stored, and charged; so its rows are thinned as any, and a job token that
    cancels each call fills nothing past MAX_POINTS a key or jobBytesPerUser."""
    async with (
        bare_server(tmp_path, WAITS) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        stub = client._stubs[0]
        await client.submit(job_spec("j", ["true"]), queue_anyway=True)
        job_id = server.controller.view.find("j").id
        charged_before = server.submits._bytes["root"]
        store, real = server.store, server.store._commit
        for round_ in range(3):
            entered, release = asyncio.Event(), asyncio.Event()

            async def held(batch: Batch, entered=entered, release=release) -> None:
                if batch.report_points:
                    entered.set()
                    await release.wait()
                await real(batch)

            store._commit = held  # type: ignore[method-assign]
            points = [
                arranger_pb2.ReportPoint(step=round_ * 10_000 + s, values={"loss": 1.0})
                for s in range(MAX_POINTS)
            ]
            call = stub.ReportValues(arranger_pb2.ReportValuesRequest(job="j", points=points))
            await eventually(entered.is_set, what="the report to be writing")
            call.cancel()
            release.set()
            await server.changes.writes.written()
            await eventually(
                lambda: not server.reports.lock(job_id).locked(), what="the report to be kept"
            )
        stored = (await server.store.load_reports()).get(job_id)
        memory = server.reports.of(job_id)
        charged = server.submits._bytes["root"] - charged_before
        rows = len(stored.series["loss"].steps) if stored else 0
        assert stored == memory and rows <= MAX_POINTS, (
            f"the store keeps {rows} points of one key (at most {MAX_POINTS}), memory "
            f"{'none' if memory is None else len(memory.series['loss'].steps)}; charged "
            f"{charged} bytes for them"
        )


async def test_a_jobs_step_is_the_same_after_a_restart(tmp_path: Path, store_url: str) -> None:
    """A job's step is its newest kept point's, in memory as when loaded: a report at a lower
    step of another key (no rewind of the first), or a point with no values, changes it in
    neither."""
    config = dataclasses.replace(WAITS, store=store_url)
    async with (
        bare_server(tmp_path, config) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        stub = client._stubs[0]
        await client.submit(job_spec("j", ["true"]), queue_anyway=True)
        job_id = server.controller.view.find("j").id
        for step, values in ((100, {"a": 1.0}), (5, {"b": 2.0})):
            point = arranger_pb2.ReportPoint(step=step, values=values)
            await stub.ReportValues(arranger_pb2.ReportValuesRequest(job="j", points=[point]))
        before = server.reports.of(job_id)
    async with bare_server(tmp_path, config) as server:
        after = server.reports.of(job_id)
    assert after == before, f"memory before a restart {before}, loaded after {after}"
