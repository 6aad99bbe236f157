"""A sweep's submit publishes one ADDED per member in one change: a watcher of every job
gets them all (one change's news is queued whole), and is dropped only when it was already
MAX_BACKLOG behind before it."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import grpc

from arranger.client.sdk import AsyncClient
from arranger.server.limits import UserLimits
from arranger.v1 import arranger_pb2
from tests.conftest import bare_server
from tests.server.test_experiments import WAITS, submit, sweep


async def test_a_large_sweep_does_not_drop_every_watcher(tmp_path: Path) -> None:
    limits = UserLimits(jobs_per_user=5_000, members_per_experiment=2_000)
    config = dataclasses.replace(WAITS, limits=limits)
    async with (
        bare_server(tmp_path, config) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        stream = client._stubs[0].WatchJobs(arranger_pb2.WatchJobsRequest())
        first = await stream.read()
        assert first.type == "SYNCED"
        await submit(client, sweep("wide", {"lr": list(range(1_001))}))
        added = 0
        try:
            while added < 1_001:
                msg = await asyncio.wait_for(stream.read(), timeout=30)
                added += msg.type == "ADDED"
        except grpc.aio.AioRpcError as exc:
            raise AssertionError(
                f"the watcher was dropped after {added} of 1,001 ADDED: {exc.code()} "
                f"{exc.details()}"
            ) from None
        finally:
            stream.cancel()
