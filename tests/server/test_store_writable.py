"""A store that refuses writes is visible: gRPC health NOT_SERVING (the server as a whole and
its service), `arranger_store_writable` 0 and the failures counted, until the store takes a
write again, found by the server's own small write. Real SQLite file, locked by another
connection as a backup tool or a stray sqlite3 shell would."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from arranger.client.sdk import ArrangerError, AsyncClient
from arranger.server import store_health
from tests.conftest import bare_server, eventually, job_spec

SERVICES = ("", "arranger.v1.Arranger")


def metric(exposition: bytes, name: str) -> float:
    for line in exposition.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not exposed")


async def test_health_and_metrics_follow_a_store_that_refuses_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_health, "PROBE_S", 0.2)
    async with bare_server(tmp_path / "server") as server:
        address = f"127.0.0.1:{server.port}"
        async with (
            grpc.aio.insecure_channel(address) as channel,
            AsyncClient(address, timeout_s=30) as client,
        ):
            health = health_pb2_grpc.HealthStub(channel)

            async def statuses() -> set[int]:
                return {
                    (await health.Check(health_pb2.HealthCheckRequest(service=name))).status
                    for name in SERVICES
                }

            serving = health_pb2.HealthCheckResponse.SERVING
            assert await statuses() == {serving}
            assert metric(server.metrics.exposition(), "arranger_store_writable") == 1.0
            locker = sqlite3.connect(tmp_path / "server" / "arranger.db", isolation_level=None)
            with contextlib.closing(locker):
                locker.execute("BEGIN EXCLUSIVE")  # every other writer waits, then gives up
                with pytest.raises(ArrangerError) as refused:
                    await client.submit(job_spec("blocked", ["true"]))
                assert refused.value.code == grpc.StatusCode.UNAVAILABLE
                assert "database is locked" in refused.value.message
                assert await statuses() == {health_pb2.HealthCheckResponse.NOT_SERVING}
                exposed = server.metrics.exposition()
                assert metric(exposed, "arranger_store_writable") == 0.0
                assert metric(exposed, "arranger_store_write_failures_total") >= 1.0
                locker.execute("ROLLBACK")
            await eventually(lambda: server.store_health.writable, what="a write to be taken")
            assert await statuses() == {serving}
            assert metric(server.metrics.exposition(), "arranger_store_writable") == 1.0
            kinds = [e.kind for e in await client.events()]
            assert "StoreWritable" in kinds, kinds
            await client.submit(job_spec("after", ["true"]))
