"""played_agent: an agent the test plays on a real server's AgentService stream. It sends the
Register the test gives, then what the test writes, and the test reads what the server orders
(or an AnsweringAgent answers them as a real agent would)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc

from arranger.v1 import agent_pb2, agent_pb2_grpc, node_pb2
from tests.conftest import eventually

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


def killed(kill: agent_pb2.KillPod) -> agent_pb2.AgentMessage:
    """killed: the agent's report that the attempt a KillPod named ended on SIGTERM."""
    report = agent_pb2.PodReport(
        pod_uid=kill.pod_uid,
        attempt=kill.attempt,
        state="Killed",
        exit_code=143,
        finish_time=time.time(),
    )
    return agent_pb2.AgentMessage(pod_reports=agent_pb2.PodReports(reports=[report]))


class AnsweringAgent:
    """AnsweringAgent: the played agent on `stream`, answering the server as a real one would:
    each launch with a Running report, each kill with a Killed one. `launched` and `killed`
    are the pods it was told to start and to stop, by name, in order; `gpus` the GPUs each
    job's pod was launched on, by job name; `acks` how many heartbeats the server answered."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.launched: list[str] = []
        self.killed: list[str] = []
        self.gpus: dict[str, list[int]] = {}
        self.acks = 0
        self._names: dict[str, str] = {}  # pod uid -> its name
        self._writing = asyncio.Lock()  # answers and heartbeats: one write at a time on a call
        self._task = asyncio.create_task(self._answer())

    async def _write(self, msg: agent_pb2.AgentMessage) -> None:
        async with self._writing:
            await self.stream.write(msg)

    async def _answer(self) -> None:
        while True:
            msg = await self.stream.read()
            if msg is grpc.aio.EOF:
                return
            body = msg.WhichOneof("body")
            if body == "heartbeat_ack":
                self.acks += 1
            if body != "commands":
                continue
            for launch in msg.commands.launch:
                self._names[launch.pod_uid] = launch.pod_name
                self.launched.append(launch.pod_name)
                self.gpus[launch.job_name] = [g.index for g in launch.gpus]
                await self._write(running(launch))
            for kill in msg.commands.kill:
                self.killed.append(self._names.get(kill.pod_uid, kill.pod_uid))
                await self._write(killed(kill))

    async def heartbeats(self, problems: dict[int, str], count: int = 1) -> None:
        """heartbeats sends `count` heartbeats naming the unhealthy GPUs, and waits for the
        server's answer to each (it has taken them by then)."""
        said = [agent_pb2.GpuProblem(index=i, reason=r) for i, r in problems.items()]
        expected = self.acks + count
        for _ in range(count):
            beat = agent_pb2.Heartbeat(usage=node_pb2.NodeUsage(), gpu_problems=said)
            await self._write(agent_pb2.AgentMessage(heartbeat=beat))
        await eventually(lambda: self.acks >= expected, what="heartbeats answered")

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
