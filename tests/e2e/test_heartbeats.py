"""Heartbeats stretch as agents join: a real server and real agents on 127.0.0.1.

With maxHeartbeatsPerSecond 5, three agents stretch the period from 0.2 s to 0.6 s and the
fence from 2 s to 2.25 s. The first agent registered alone: it can only learn the new timing
from the answers to its heartbeats. Tests wait on conditions, never for time to pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from arranger.agent.agent import RESYNC_PERIODS, Agent, resync_period_s
from arranger.agent.config import AgentConfig
from arranger.server.agent_service import AgentServicer
from arranger.server.app import ArrangerServer
from arranger.server.effects import Effects
from arranger.server.heartbeats import agent_period, fence_timeout, node_timeout
from arranger.states import NodeState
from arranger.v1 import agent_pb2, agent_pb2_grpc, node_pb2
from tests.conftest import FAST, NODE, bare_server, eventually

CONFIG = dataclasses.replace(FAST, max_heartbeats_per_second=5.0, fence_timeout_s=2.0)
ALONE_S, STRETCHED_S = 0.2, 0.6  # the period for one agent, and for three


@contextlib.asynccontextmanager
async def agents(server: ArrangerServer, root: Path, *names: str) -> AsyncIterator[list[Agent]]:
    """agents: real agents of `names`, each started once the one before has registered."""
    started: list[Agent] = []
    try:
        for name in names:
            config = AgentConfig(
                server=f"127.0.0.1:{server.port}",
                node_name=name,
                address="127.0.0.1",
                data_dir=root / name,
                heartbeat_interval_s=1.0,
                fence_timeout_s=9.0,
                reconnect_max_s=0.2,
                limits=False,
            )
            agent = Agent(config, NODE)
            agent.start()
            started.append(agent)
            await eventually(
                lambda: agent.connected.is_set() and name in server.links,  # noqa: B023
                what=f"{name} to register",
            )
        yield started
    finally:
        for agent in started:
            await agent.stop()


def heartbeats_heard(server: ArrangerServer) -> dict[str, int]:
    """heartbeats_heard counts, by node, the heartbeats the server hears from now on."""
    heard: dict[str, int] = {}
    hear = server.controller.heartbeat

    def counting(name: str, *facts: Any) -> Effects:
        heard[name] = heard.get(name, 0) + 1
        return hear(name, *facts)

    server.controller.heartbeat = counting  # type: ignore[method-assign]
    return heard


async def test_agents_take_the_stretched_period_from_the_answers_to_their_heartbeats(
    tmp_path: Path,
) -> None:
    async with (
        bare_server(tmp_path / "server", CONFIG) as server,
        agents(server, tmp_path, "hb-0") as (first,),
    ):
        assert first.heartbeat_interval_s == agent_period(ALONE_S, "hb-0"), "from Registered"
        assert first.contact.fence_timeout_s == 2.0
        async with agents(server, tmp_path, "hb-1", "hb-2") as others:
            assert server.heartbeats.period_s == STRETCHED_S
            assert server.controller.node_timeout_s == node_timeout(STRETCHED_S, CONFIG) == 12.0
            fence = fence_timeout(STRETCHED_S, CONFIG)
            assert fence == 2.25
            await eventually(
                lambda: first.heartbeat_interval_s == agent_period(STRETCHED_S, "hb-0"),
                what="the first agent to take the stretched period from an ack",
            )
            assert first.contact.fence_timeout_s == fence, "the fence grew with it"
            for agent in others:  # registered into the larger cluster, or told since
                node = agent.config.node_name
                await eventually(
                    lambda: agent.heartbeat_interval_s == agent_period(STRETCHED_S, node),  # noqa: B023
                    what=f"{node}'s period",
                )
        # Agents that leave do not shorten it: those still connected may wait as they were told.
        assert server.heartbeats.period_s == STRETCHED_S
        assert first.heartbeat_interval_s == agent_period(STRETCHED_S, "hb-0")


async def test_an_ack_without_the_timing_keeps_the_agents_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older server answers heartbeats with an empty ack: its agents keep what they were
    told at registration."""

    def empty(self: AgentServicer, node: str) -> agent_pb2.HeartbeatAck:
        return agent_pb2.HeartbeatAck()

    monkeypatch.setattr(AgentServicer, "_ack", empty)
    async with (
        bare_server(tmp_path / "server", CONFIG) as server,
        agents(server, tmp_path, "hb-0", "hb-1", "hb-2") as (first, *_),
    ):
        assert server.heartbeats.period_s == STRETCHED_S
        heard = heartbeats_heard(server)
        await eventually(lambda: heard.get("hb-0", 0) >= 3, what="three more heartbeats")
        assert first.heartbeat_interval_s == agent_period(ALONE_S, "hb-0")
        assert first.contact.fence_timeout_s == 2.0
        assert server.controller.nodes["hb-0"].state == NodeState.READY


async def test_the_protocol_carries_the_timing_in_registered_and_every_ack(
    tmp_path: Path,
) -> None:
    """What an agent of any version receives (an older one ignores the ack's fields and keeps
    heartbeating at the period it registered with)."""
    async with (
        bare_server(tmp_path / "server", CONFIG) as server,
        grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        streams: list[Stream] = []
        try:
            registered: list[agent_pb2.Registered] = []
            for name in ("raw-0", "raw-1", "raw-2"):
                streams.append(await connect(channel, name))
                registered.append(await read(streams[-1], "registered"))
                await eventually(lambda: name in server.links, what=f"{name} to register")  # noqa: B023
            assert registered[0].heartbeat_interval_s == agent_period(ALONE_S, "raw-0")
            assert registered[0].fence_timeout_s == 2.0
            assert registered[2].heartbeat_interval_s == agent_period(STRETCHED_S, "raw-2")
            assert registered[2].fence_timeout_s == 2.25
            usage = node_pb2.NodeUsage(cpu_percent=1.0, memory_used=2**20)  # as agents send
            beat = agent_pb2.Heartbeat(usage=usage)
            await streams[0].write(agent_pb2.AgentMessage(heartbeat=beat))
            ack = await read(streams[0], "heartbeat_ack")
            assert ack.heartbeat_interval_s == agent_period(STRETCHED_S, "raw-0")
            assert ack.HasField("fence_timeout_s") and ack.fence_timeout_s == 2.25
        finally:
            for stream in streams:
                stream.cancel()


async def test_a_restarted_server_starts_from_the_timing_it_may_have_told(tmp_path: Path) -> None:
    """Agents cut off by a restart hold the timing the last run told them until they register
    again: the new run's node timeout must cover their fence, so it counts the nodes that were
    Ready."""
    async with (
        bare_server(tmp_path / "server", CONFIG) as server,
        grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        streams = [await connect(channel, f"raw-{i}") for i in range(3)]
        for i, stream in enumerate(streams):
            await read(stream, "registered")
            await eventually(lambda: f"raw-{i}" in server.links, what=f"raw-{i}")  # noqa: B023
        for stream in streams:
            stream.cancel()
    async with bare_server(tmp_path / "server", CONFIG) as again:
        assert again.heartbeats.agents == 3 and again.heartbeats.period_s == STRETCHED_S
        assert again.controller.node_timeout_s == node_timeout(STRETCHED_S, CONFIG)


Stream = grpc.aio.StreamStreamCall[agent_pb2.AgentMessage, agent_pb2.ServerMessage]


async def connect(channel: grpc.aio.Channel, name: str) -> Stream:
    """connect opens an agent's stream and registers node `name`; the test sends the rest."""
    stream: Stream = agent_pb2_grpc.AgentServiceStub(channel).Connect()
    register = agent_pb2.Register(
        node_name=name,
        address="127.0.0.1",
        agent_version="test",
        capacity=node_pb2.NodeResources(cpu=1, memory=2**30),
    )
    await stream.write(agent_pb2.AgentMessage(register=register))
    await stream.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat()))  # accepts
    return stream


async def read(stream: Stream, kind: str) -> Any:
    """read: the body of the server's next message, which must be of `kind`."""
    msg = await stream.read()
    assert isinstance(msg, agent_pb2.ServerMessage) and msg.WhichOneof("body") == kind, msg
    return getattr(msg, kind)


def test_the_full_pod_list_follows_the_stretched_period() -> None:
    """An agent's full pod list goes every resync interval (30 s) while the period is short,
    and every RESYNC_PERIODS periods once the cluster stretches it: at 5,000 agents (50-62.5 s)
    about 15 lists a second from all agents, not 167."""
    assert resync_period_s(30.0, 5.0) == 30.0
    assert resync_period_s(30.0, 62.5) == RESYNC_PERIODS * 62.5 == 375.0
    assert 5_000 / resync_period_s(30.0, 50.0) < 17 < 5_000 / 30.0
