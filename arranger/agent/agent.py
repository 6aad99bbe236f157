"""agent is arranger-agent's I/O shell: the stream to the server, heartbeats, fencing.

The agent connects, registers with its capacity and every pod it still knows, then carries out
the server's orders and reports each pod change. When the stream breaks it reconnects with
back-off; if it stays cut off for longer than the fence timeout it stops its pods, so the server
can safely start replacements elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import grpc
import structlog

import arranger
from arranger.agent.config import AgentConfig, route_address
from arranger.agent.discovery import Capacity, fake_gpus, machine_capacity, usage
from arranger.agent.logs import read_log
from arranger.agent.supervisor import PodRun, Supervisor
from arranger.v1 import agent_pb2, agent_pb2_grpc, node_pb2

log = structlog.get_logger("arranger.agent")

KEEPALIVE = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]


class Agent:
    """Agent serves one node until `stop()`."""

    def __init__(self, config: AgentConfig, capacity: Capacity | None = None) -> None:
        """`capacity`, when given, replaces discovery, share and reserve (tests set exact sizes)."""
        self.config = config
        self.address = config.address or route_address(config.server)
        self.capacity = capacity if capacity is not None else self._capacity(machine_capacity())
        self.supervisor = Supervisor(
            config.node_name, self.address, config.data_dir, self._on_change, config.path_prepend
        )
        self.connected = asyncio.Event()
        self.fence_timeout_s = config.fence_timeout_s
        self.heartbeat_interval_s = config.heartbeat_interval_s
        self._out: asyncio.Queue[agent_pb2.AgentMessage] | None = None
        self._pending: dict[str, PodRun] = {}
        self._flush_scheduled = False
        self._log_tasks: dict[int, asyncio.Task[None]] = {}
        self._disconnected_at = time.monotonic()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _capacity(self, found: Capacity) -> Capacity:
        """_capacity: this agent's share of the machine, less the reserve, with any fake GPUs."""
        share = max(1, self.config.share)
        cpu = max(0, found.cpu_milli // share - self.config.reserve_cpu_milli)
        memory = max(0, found.memory_bytes // share - self.config.reserve_memory_bytes)
        gpus = found.gpus
        if self.config.fake_gpus:
            gpus = tuple(
                fake_gpus(self.config.fake_gpus, self.config.fake_gpu_model, self.config.node_name)
            )
        return Capacity(cpu, memory, gpus)

    # Lifecycle.

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name=f"agent {self.config.node_name}")

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.config.kill_pods_on_exit:
            await self.supervisor.shutdown(grace_s=5.0)

    async def run(self) -> None:
        """run keeps a session with the server open, reconnecting with back-off."""
        backoff = 0.1
        fence = asyncio.create_task(self._fence_loop())
        try:
            while not self._stopping.is_set():
                started = time.monotonic()
                try:
                    await self._session()
                except grpc.aio.AioRpcError as exc:
                    log.info("server unreachable", server=self.config.server, code=exc.code().name)
                except (OSError, ConnectionError) as exc:
                    log.info("server unreachable", server=self.config.server, error=str(exc))
                self.connected.clear()
                self._disconnected_at = time.monotonic()
                self._out = None
                if time.monotonic() - started > 30:
                    backoff = 0.1
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.config.reconnect_max_s)
        finally:
            fence.cancel()

    async def _session(self) -> None:
        async with grpc.aio.insecure_channel(self.config.server, options=KEEPALIVE) as channel:
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            out: asyncio.Queue[agent_pb2.AgentMessage] = asyncio.Queue()
            out.put_nowait(agent_pb2.AgentMessage(register=self._register()))
            self._pending.clear()  # the register carries every run
            call = stub.Connect(_drain(out))
            heartbeat: asyncio.Task[None] | None = None
            try:
                async for msg in call:
                    kind = msg.WhichOneof("body")
                    if kind == "registered":
                        self._registered(msg.registered, out)
                        heartbeat = heartbeat or asyncio.create_task(self._heartbeats(out))
                    elif kind == "commands":
                        self._commands(msg.commands)
                    elif kind == "log_request":
                        self._start_log(msg.log_request)
                    elif kind == "log_cancel":
                        task = self._log_tasks.pop(msg.log_cancel.request_id, None)
                        if task is not None:
                            task.cancel()
            finally:
                if heartbeat is not None:
                    heartbeat.cancel()
                for task in self._log_tasks.values():
                    task.cancel()
                self._log_tasks.clear()
                call.cancel()

    def _register(self) -> agent_pb2.Register:
        cap = self.capacity
        reg = agent_pb2.Register(
            node_name=self.config.node_name,
            address=self.address,
            labels=self.config.labels,
            agent_version=arranger.__version__,
            runtimes=["process"],
        )
        reg.capacity.cpu, reg.capacity.memory, reg.capacity.gpu = (
            cap.cpu_milli / 1000,
            cap.memory_bytes,
            len(cap.gpus),
        )
        for gpu in cap.gpus:
            reg.gpus.add(
                index=gpu.index,
                uuid=gpu.uuid,
                model=gpu.model,
                memory=gpu.memory_bytes,
                fake=gpu.fake,
            )
        reg.pods.extend(run.report() for run in self.supervisor.runs.values())
        return reg

    def _registered(
        self, msg: agent_pb2.Registered, out: asyncio.Queue[agent_pb2.AgentMessage]
    ) -> None:
        if msg.heartbeat_interval_s > 0:
            self.heartbeat_interval_s = msg.heartbeat_interval_s
        self.fence_timeout_s = msg.fence_timeout_s
        self._out = out
        self.connected.set()
        log.info("registered", node=self.config.node_name, server=self.config.server)
        if self._pending:
            self._flush()

    async def _heartbeats(self, out: asyncio.Queue[agent_pb2.AgentMessage]) -> None:
        usage()  # the first CPU reading only starts the measurement
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            cpu, memory = usage()
            out.put_nowait(
                agent_pb2.AgentMessage(
                    heartbeat=agent_pb2.Heartbeat(
                        usage=node_pb2.NodeUsage(cpu_percent=cpu, memory_used=memory)
                    )
                )
            )

    async def _fence_loop(self) -> None:
        """_fence_loop stops every pod once the server has been unreachable for fenceTimeout."""
        fenced = False
        while True:
            await asyncio.sleep(1.0)
            if self.connected.is_set():
                fenced = False
                continue
            silent = time.monotonic() - self._disconnected_at
            if self.fence_timeout_s > 0 and silent > self.fence_timeout_s and not fenced:
                log.warning("fencing: server unreachable, stopping pods", silent_s=round(silent))
                await self.supervisor.shutdown(grace_s=5.0)
                fenced = True

    # Orders and reports.

    def _commands(self, commands: agent_pb2.Commands) -> None:
        for launch in commands.launch:
            self.supervisor.launch(launch)
        for kill in commands.kill:
            self.supervisor.kill(kill)
        for uid in commands.forget_pods:
            self.supervisor.forget(uid)
        for job_id in commands.purge_jobs:
            self.supervisor.purge(job_id)

    def _on_change(self, run: PodRun) -> None:
        """_on_change batches reports: every change in one loop turn goes in one message."""
        self._pending[run.uid] = run
        if self._out is not None and not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out is None or not self._pending:
            return
        reports = [run.report() for run in self._pending.values()]
        self._pending.clear()
        self._out.put_nowait(
            agent_pb2.AgentMessage(pod_reports=agent_pb2.PodReports(reports=reports))
        )

    def _start_log(self, request: agent_pb2.LogRequest) -> None:
        out = self._out
        if out is None:
            return
        task = asyncio.create_task(self._send_log(request, out))
        self._log_tasks[request.request_id] = task
        task.add_done_callback(lambda _: self._log_tasks.pop(request.request_id, None))

    async def _send_log(
        self, request: agent_pb2.LogRequest, out: asyncio.Queue[agent_pb2.AgentMessage]
    ) -> None:
        path = self.supervisor.log_path(request.pod_uid, request.attempt)

        def running() -> bool:
            run = self.supervisor.runs.get(request.pod_uid)
            return run is not None and run.attempt == request.attempt and not run.ended.is_set()

        rid = request.request_id
        try:
            async for data in read_log(path, request.tail_bytes, request.follow, running):
                out.put_nowait(
                    agent_pb2.AgentMessage(log_data=agent_pb2.LogData(request_id=rid, data=data))
                )
        except OSError as exc:
            error = f"no log for attempt {request.attempt}: {exc.strerror or exc}"
            out.put_nowait(
                agent_pb2.AgentMessage(
                    log_data=agent_pb2.LogData(request_id=rid, eof=True, error=error)
                )
            )
            return
        out.put_nowait(agent_pb2.AgentMessage(log_data=agent_pb2.LogData(request_id=rid, eof=True)))


async def _drain(
    queue: asyncio.Queue[agent_pb2.AgentMessage],
) -> AsyncIterator[agent_pb2.AgentMessage]:
    while True:
        yield await queue.get()
