"""A burst of calls while the server's event loop is busy: gRPC core holds them until the loop
picks them up, however many, instead of refusing some at random (its default past 1,000), as
when a fleet of agents reconnects at once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.conftest import bare_server

CALLS = 1_500  # past gRPC's default backlog of 1,000; it refuses every call past 3,000
BUSY_S = 1.0  # long enough for every call to reach the server while its loop is held


async def test_calls_that_wait_for_a_busy_server_are_all_answered(tmp_path: Path) -> None:
    async with bare_server(tmp_path / "server") as server:
        # A synchronous channel: its own threads send the calls while the loop is held.
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            calls = [stub.Check.future(health_pb2.HealthCheckRequest()) for _ in range(CALLS)]
            # Holding the server's event loop (this one) is the point: it takes no call meanwhile.
            time.sleep(BUSY_S)  # noqa: ASYNC251
            errors = await asyncio.to_thread(lambda: [call.exception() for call in calls])
    refused = [error for error in errors if error is not None]
    assert not refused, f"{len(refused)} of {CALLS} refused, first: {refused[0]}"
