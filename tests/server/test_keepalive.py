"""An agent's stream may carry no message for a while (heartbeats stretch to a minute in a
large cluster): the agent's keepalive pings meanwhile must not cost it its connection."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from arranger.server import transport
from arranger.v1 import agent_pb2, agent_pb2_grpc
from tests.conftest import bare_server

PING_MS = 1_000  # the agent's keepalive (10 s), scaled down
QUIET_S = 6.0  # long enough for gRPC's default policy to drop the connection (4 pings)


async def test_an_agent_that_pings_between_sparse_messages_keeps_its_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transport, "AGENT_PING_MIN_INTERVAL_MS", PING_MS // 2)
    async with bare_server(tmp_path / "server") as server:
        options = [
            ("grpc.keepalive_time_ms", PING_MS),
            ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}", options) as channel:
            call = agent_pb2_grpc.AgentServiceStub(channel).Connect()
            await call.write(agent_pb2.AgentMessage(register=agent_pb2.Register(node_name="n1")))
            first = await call.read()
            assert first.WhichOneof("body") == "registered"
            # No heartbeat, so the server sends nothing: the stream must stay open regardless
            # (asyncio.wait leaves the read running: cancelling it would cancel the call).
            read = asyncio.ensure_future(call.read())
            await asyncio.wait([read], timeout=QUIET_S)
            ended = read.exception() if read.done() else None
            assert not read.done(), f"the stream ended: {ended}"
            call.cancel()
            await asyncio.gather(read, return_exceptions=True)
