"""GetReports answers an experiment's every member's every series within a bounded reply
(REPLY_POINTS points, each series thinned evenly, its newest point kept), however many
members report however many keys."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import grpc
import pytest

from arranger.client.sdk import AsyncClient
from arranger.server.limits import UserLimits
from arranger.server.reports import MAX_POINTS, JobReports, Series
from arranger.v1 import arranger_pb2
from tests.conftest import bare_server
from tests.server.test_experiments import WAITS, submit, sweep

MEMBERS, KEYS = 1_000, 24


async def test_get_reports_of_a_large_experiment_is_answered(tmp_path: Path) -> None:
    config = dataclasses.replace(WAITS, limits=UserLimits(jobs_per_user=2_000))
    async with (
        bare_server(tmp_path, config) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        exp = (await submit(client, sweep("big", {"lr": list(range(MEMBERS))}))).experiment
        steps = [1_000 * (i + 1) for i in range(MAX_POINTS)]  # as a long run thins them
        for job in server.controller.view.members(server.controller.view.experiment(exp.id)):
            series = {f"k{k}": Series(list(steps), [0.1 * k] * MAX_POINTS) for k in range(KEYS)}
            server.reports.put(job.id, JobReports(series, {}, steps[-1]))  # as ReportValues keeps
        started = time.perf_counter()
        try:
            reply = await client._stubs[0].GetReports(arranger_pb2.GetReportsRequest(name="big"))
        except grpc.aio.AioRpcError as exc:
            pytest.fail(
                f"GetReports of {MEMBERS} members x {KEYS} keys refused after "
                f"{time.perf_counter() - started:.1f}s: {exc.code()} {exc.details()}"
            )
        assert len(reply.jobs) == MEMBERS
