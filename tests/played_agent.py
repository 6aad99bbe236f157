"""played_agent: an agent the test plays on a real server's AgentService stream. It sends the
Register the test gives, then what the test writes, and the test reads what the server orders."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc

from arranger.v1 import agent_pb2, agent_pb2_grpc, node_pb2

Stream = grpc.aio.StreamStreamCall[agent_pb2.AgentMessage, agent_pb2.ServerMessage]


def registration(name: str, **fields: object) -> agent_pb2.Register:
    """registration: node `name`'s Register, 4 cores and 8 GiB, plus `fields` (gpus=...)."""
    return agent_pb2.Register(
        node_name=name,
        address="127.0.0.1",
        agent_version="test",
        capacity=node_pb2.NodeResources(cpu=4, memory=8 * 2**30),
        **fields,  # type: ignore[arg-type]
    )


@asynccontextmanager
async def played_agent(address: str, register: agent_pb2.Register) -> AsyncIterator[Stream]:
    """played_agent: an agent's stream to the server at `address` that has sent `register`."""
    async with grpc.aio.insecure_channel(address) as channel:
        stream: Stream = agent_pb2_grpc.AgentServiceStub(channel).Connect()
        await stream.write(agent_pb2.AgentMessage(register=register))
        await stream.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat()))  # accepted
        try:
            yield stream
        finally:
            stream.cancel()


async def launches(
    stream: Stream, count: int, timeout_s: float = 30.0
) -> list[agent_pb2.LaunchPod]:
    """launches: the next `count` LaunchPod orders the server sends on the stream."""
    found: list[agent_pb2.LaunchPod] = []
    deadline = time.monotonic() + timeout_s
    while len(found) < count:
        msg = await asyncio.wait_for(stream.read(), max(0.1, deadline - time.monotonic()))
        assert isinstance(msg, agent_pb2.ServerMessage), msg
        if msg.WhichOneof("body") == "commands":
            found.extend(msg.commands.launch)
    return found


def running(launch: agent_pb2.LaunchPod) -> agent_pb2.AgentMessage:
    """running: the agent's report that the launched attempt runs, each port on 40000."""
    report = agent_pb2.PodReport(
        pod_uid=launch.pod_uid,
        attempt=launch.attempt,
        state="Running",
        pid=4242,
        ports={name: 40_000 for name in launch.ports},
        start_time=time.time(),
    )
    return agent_pb2.AgentMessage(pod_reports=agent_pb2.PodReports(reports=[report]))
