"""Reported values are charged to their job's owner: a job keeps up to 64 keys x 256 points
until it is pruned (30 days after it ends), and they count against limits.jobBytesPerUser
with its spec, so a user who runs short jobs that report cannot fill the store. A report
writes what it changed, not the job's whole history."""

from __future__ import annotations

import dataclasses
import random
import sqlite3
from pathlib import Path

import grpc

from arranger.client.sdk import AsyncClient
from arranger.server.limits import UserLimits
from arranger.server.reports import MAX_KEYS, MAX_POINTS, POINT_BYTES
from arranger.server.store import Batch
from arranger.v1 import arranger_pb2
from tests.conftest import bare_server, job_spec
from tests.server.test_experiments import WAITS

LIMIT = 2 * 2**20


def full(name: str) -> arranger_pb2.ReportValuesRequest:
    rng = random.Random(name)
    points = [
        arranger_pb2.ReportPoint(
            step=1_000_000_000 + 997 * i, values={f"k{k}": rng.random() for k in range(MAX_KEYS)}
        )
        for i in range(MAX_POINTS)
    ]
    return arranger_pb2.ReportValuesRequest(job=name, points=points)


async def test_reported_values_count_toward_job_bytes_per_user(tmp_path: Path) -> None:
    config = dataclasses.replace(WAITS, limits=UserLimits(job_bytes_per_user=LIMIT))
    async with (
        bare_server(tmp_path, config) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        stub = client._stubs[0]
        refused = None
        for i in range(12):
            await client.submit(job_spec(f"r{i}", ["true"]), queue_anyway=True)
            try:
                await stub.ReportValues(full(f"r{i}"))
            except grpc.aio.AioRpcError as exc:
                refused = exc
                break
            await client.stop(f"r{i}")  # ended: jobsPerUser no longer counts it
        with sqlite3.connect(tmp_path / "arranger.db") as db:
            (points,) = db.execute("SELECT count(*) FROM report_points").fetchone()
        assert refused is not None and refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (refused.details() or "").startswith("limits.jobBytesPerUser: user 'root'")
        assert points * POINT_BYTES <= LIMIT


async def test_a_one_point_report_does_not_rewrite_the_whole_history(tmp_path: Path) -> None:
    """Once a job's series are full, a new point writes its row and deletes those its thinning
    drops (half of them, at once); the next ones a row each: two rows a point, amortised,
    never the whole history."""
    async with (
        bare_server(tmp_path, WAITS) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        stub = client._stubs[0]
        await client.submit(job_spec("r", ["true"]), queue_anyway=True)  # it waits, unplaced
        await stub.ReportValues(full("r"))
        store, real = server.store, server.store._commit
        written: list[int] = []

        async def counting(batch: Batch) -> None:
            written.append(sum(len(rows) for rows in batch.report_rows()))
            await real(batch)

        store._commit = counting  # type: ignore[method-assign]
        for n in range(MAX_POINTS // 2):
            one = arranger_pb2.ReportPoint(step=2_000_000_000 + n, values={"k0": 0.5})
            await stub.ReportValues(arranger_pb2.ReportValuesRequest(job="r", points=[one]))
        # The first writes its point and drops half the history (thinned); the others one row.
        assert written == [MAX_POINTS // 2 + 1] + [1] * (MAX_POINTS // 2 - 1)
