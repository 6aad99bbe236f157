"""Time that cannot jump: steps of the wall clock change no decision, and a silent agent is
NotReady nodeTimeout after its last message, whatever happens to its connection.

A real server with fencing on and node timeouts scaled down to seconds, and a node whose
messages the test sends: the wall clock (`time.time`) is stepped by ±10 minutes and a node
check runs at once, when a decision taken on wall time would show.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from arranger.server.app import ArrangerServer
from arranger.server.clock import SteadyClock
from arranger.server.controller import ControllerConfig
from arranger.states import NodeState
from arranger.v1 import agent_pb2, agent_pb2_grpc, node_pb2
from tests.conftest import FAST, eventually

QUICK = dataclasses.replace(
    FAST, fence_timeout_s=0.0, controller=dataclasses.replace(FAST.controller, node_timeout_s=2.0)
)
# Fencing on, so that a node the server believed lost would have its pods replaced.
FENCED = dataclasses.replace(
    FAST, fence_timeout_s=1.0, controller=dataclasses.replace(FAST.controller, node_timeout_s=7.5)
)


def test_a_steady_clock_ignores_steps_of_the_wall_clock() -> None:
    wall = [1_000.0]
    ticks = [0.0]
    clock = SteadyClock(wall=lambda: wall[0], monotonic=lambda: ticks[0])
    ticks[0] = 5.0
    wall[0] = 1_000.0 + 600  # stepped forward 10 minutes: no effect
    assert clock() == 1_005.0
    wall[0] = 1_000.0 - 600
    ticks[0] = 6.0
    assert clock() == 1_006.0


async def test_wall_clock_steps_move_no_decision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    step = [0.0]
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + step[0])
    config = dataclasses.replace(FENCED, listen="127.0.0.1:0", data_dir=tmp_path / "server")
    server = ArrangerServer(config)  # its own clock, as arranger-server makes it
    await server.start()
    try:
        async with (
            grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
            quiet_agent(channel) as agent,
        ):
            await eventually(lambda: "quiet" in server.controller.nodes, what="registration")
            for offset in (600.0, -600.0):
                step[0] = offset
                await agent.put(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat()))
                await server.run_cycle()  # a node check right after the step
                node = server.controller.nodes["quiet"]
                assert node.state == NodeState.READY, (offset, node)
                assert abs(server.clock() - real()) < 5, "the server's clock follows no step"
    finally:
        step[0] = 0.0
        await server.stop()


@contextlib.asynccontextmanager
async def quiet_agent(
    channel: grpc.aio.Channel,
) -> AsyncIterator[asyncio.Queue[agent_pb2.AgentMessage | None]]:
    """quiet_agent registers node "quiet" on the server and sends only what the test puts."""
    stub = agent_pb2_grpc.AgentServiceStub(channel)
    outbox: asyncio.Queue[agent_pb2.AgentMessage | None] = asyncio.Queue()
    register = agent_pb2.Register(
        node_name="quiet",
        address="127.0.0.1",
        agent_version="test",
        capacity=node_pb2.NodeResources(cpu=1, memory=2**30),
    )
    await outbox.put(agent_pb2.AgentMessage(register=register))
    await outbox.put(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat()))  # accepts

    async def messages() -> AsyncIterator[agent_pb2.AgentMessage]:
        while (msg := await outbox.get()) is not None:
            yield msg

    call = stub.Connect(messages())
    await call.read()  # registered
    try:
        yield outbox
    finally:
        await outbox.put(None)
        call.cancel()


@pytest.mark.parametrize("drop_connection", [False, True])
async def test_a_silent_agent_is_not_ready_node_timeout_after_its_last_message(
    tmp_path: Path, drop_connection: bool
) -> None:
    """The server's clock is injected: time passes only when the test says, and node checks
    run when it asks (run_cycle)."""
    timeout_s = 90.0
    config = dataclasses.replace(
        QUICK,
        listen="127.0.0.1:0",
        data_dir=tmp_path / "server",
        controller=ControllerConfig(node_timeout_s=timeout_s),
    )
    now = [1_000.0]
    server = ArrangerServer(config, clock=lambda: now[0])
    await server.start()
    try:
        async with (
            grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
            quiet_agent(channel) as outbox,
        ):
            await eventually(lambda: "quiet" in server.controller.nodes, what="registration")
            now[0] += 5
            await outbox.put(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat()))
            node = server.controller.nodes["quiet"]
            await eventually(lambda: node.last_seen == now[0], what="the heartbeat")
            heard = now[0]
            now[0] = heard + 49  # where gRPC used to drop a quiet agent's stream
            if drop_connection:
                await outbox.put(None)  # the agent's stream ends; the server hears nothing more
                await eventually(lambda: not node.connected, what="the disconnect")
            for silent, ready in ((timeout_s * 0.95, True), (timeout_s * 1.05, False)):
                now[0] = heard + silent
                await server.run_cycle()
                assert (node.state == NodeState.READY) is ready, (silent, node.state)
    finally:
        await server.stop()
