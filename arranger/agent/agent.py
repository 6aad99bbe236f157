"""agent is arranger-agent: its stream to the server, where protobuf is read and written (with
wire, which makes and reads the messages).

The agent connects, registers with its capacity and every pod it still knows, then, once the
server has shown it serves this agent's cluster (see membership), carries out its orders and
reports each pod change. When the stream breaks it reconnects with
back-off; if it stays cut off for longer than the fence timeout it stops its pods, so the server
can safely start replacements elsewhere (and while no agent runs, the pods' shims do: see
fence).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Coroutine
from typing import TYPE_CHECKING, Any

import grpc
import structlog
from grpc import StatusCode

import arranger
from arranger.agent import exec_session
from arranger.agent.config import AgentConfig
from arranger.agent.discovery import Capacity, usage
from arranger.agent.exec_session import ExecCommand, Input
from arranger.agent.gpu_health import gpu_problems
from arranger.agent.membership import ForeignServer, Membership
from arranger.agent.node import NodeShell
from arranger.agent.runs import PodRun
from arranger.agent.runtime import StartError
from arranger.agent.wire import (
    kill_order,
    launch_order,
    pod_report,
    problem_messages,
    sharing_message,
    usage_report,
)
from arranger.security import channel_credentials, loopback_credentials
from arranger.v1 import agent_pb2, agent_pb2_grpc, job_pb2, node_pb2

if TYPE_CHECKING:
    from arranger.v1.agent_pb2_grpc import AgentServiceAsyncStub as AgentStub

log = structlog.get_logger("arranger.agent")

KEEPALIVE = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
SILENT_PERIODS = 3  # a server unheard for this many heartbeat periods (and the margin) is left
SILENT_MARGIN_S = 5.0
RESYNC_PERIODS = 6  # the full pod list goes at most once per this many heartbeat periods
# What the server says when it will not have this agent (a token or a node name it may not
# use, another agent holding its node name): said as a warning, naming the node.
REFUSALS = (StatusCode.PERMISSION_DENIED, StatusCode.UNAUTHENTICATED, StatusCode.ALREADY_EXISTS)
KEPT_JOBS_MOST = 100_000  # jobs named in one Register (their directories, for purging)
INPUTS_HELD = 8  # a command's input messages held for it at most
ENDED_S = 5.0  # how long a command's end waits for the server to read it


class Agent(NodeShell):
    """Agent serves one node until `stop()`: the node's shell (see node) and its stream to
    the server."""

    def __init__(self, config: AgentConfig, capacity: Capacity | None = None) -> None:
        """`capacity`, when given, replaces discovery, share and reserve (tests set exact sizes)."""
        super().__init__(config, capacity)
        self._pending: dict[str, PodRun] = {}
        self._out: asyncio.Queue[agent_pb2.AgentMessage] | None = None
        self._flush_scheduled = False
        self._silenced = ""  # why the session was ended for the server's silence
        self.membership = Membership(config.data_dir)
        self.last_error: str | None = None  # why the last session with the server ended
        self.heartbeat_interval_s = config.heartbeat_interval_s
        self._log_tasks: set[asyncio.Task[None]] = set()
        self._stub: AgentStub | None = None  # while admitted
        self._execs: dict[str, asyncio.Event] = {}  # each command's "its caller has gone"

    async def run(self) -> None:
        """run keeps a session with the server open, reconnecting with back-off."""
        await self._begin()
        fence = asyncio.create_task(self._fence_loop())
        try:
            while not self._stopping.is_set():
                started = time.monotonic()
                try:
                    await self._session()
                except grpc.aio.AioRpcError as exc:
                    self.last_error = f"{exc.code().name}: {exc.details()}"
                    if exc.code() in REFUSALS:
                        log.warning(
                            "server refused this agent",
                            node=self.config.node_name,
                            error=self.last_error,
                        )
                    else:
                        log.info(
                            "server unavailable",
                            server=self.server,
                            code=exc.code().name,
                            error=exc.details(),
                        )
                        self.servers.refused(exc.details() or "")
                except (OSError, ConnectionError) as exc:
                    log.info("server unreachable", server=self.server, error=str(exc))
                except ForeignServer as exc:
                    self.last_error = str(exc)
                    log.warning("server refused: not this agent's", error=self.last_error)
                self.connected.clear()
                self._out = None
                delay = self.servers.next(time.monotonic() - started)
                if delay:  # each was tried: wait before the next round
                    await asyncio.sleep(delay)
        finally:
            fence.cancel()

    @property
    def server(self) -> str:
        """server: the server this agent talks to, or tries next."""
        return self.servers.current

    async def _session(self) -> None:
        tls, secret = self.config.tls, self.config.secret
        if tls is not None:
            channel = grpc.aio.secure_channel(self.server, channel_credentials(tls), KEEPALIVE)
        elif secret:
            channel = grpc.aio.secure_channel(self.server, loopback_credentials(secret), KEEPALIVE)
        else:
            channel = grpc.aio.insecure_channel(self.server, options=KEEPALIVE)
        async with channel:
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            out: asyncio.Queue[agent_pb2.AgentMessage] = asyncio.Queue()
            out.put_nowait(agent_pb2.AgentMessage(register=self._register()))
            self._pending.clear()  # the register carries every run
            call = stub.Connect(_drain(out))
            tasks: list[asyncio.Task[None]] = []
            self._silenced = ""
            try:
                admitted = False  # nothing is obeyed until the server proves its cluster
                async for msg in call:
                    kind = msg.WhichOneof("body")
                    if kind == "registered":
                        self.membership.admit(
                            msg.registered.cluster_id, self.server, msg.registered.epoch
                        )
                        admitted = True
                    if not admitted:
                        continue
                    self.contact.heard()
                    if kind == "registered":
                        self._stub = stub
                        self._registered(msg.registered, out)
                        if not tasks:
                            tasks = [
                                asyncio.create_task(self._heartbeats(out)),
                                asyncio.create_task(self._resyncs(out)),
                                asyncio.create_task(self._silence(call)),
                                asyncio.create_task(self._usage(out)),
                            ]
                    elif kind == "heartbeat_ack":
                        self._heartbeat_ack(msg.heartbeat_ack)
                    elif kind == "commands":
                        self._commands(msg.commands)
                    elif kind == "log_request":
                        self._start_log(msg.log_request, out)
                    elif kind == "exec":
                        self._spawn(self._exec(msg.exec, stub))
                    elif kind == "exec_cancel" and msg.exec_cancel in self._execs:
                        self._execs[msg.exec_cancel].set()
            except asyncio.CancelledError:
                if not self._silenced:
                    raise  # the agent stops
                raise ConnectionError(self._silenced) from None
            finally:
                self._stub = None
                for task in [*tasks, *self._log_tasks]:
                    task.cancel()
                self._log_tasks.clear()
                call.cancel()

    async def _fetch_package(self, sha256: str) -> AsyncIterator[bytes]:
        """_fetch_package streams a package from the server this agent is admitted by."""
        if self._stub is None:
            raise StartError(126, "PackageUnavailable: no server to fetch the package from")
        request = agent_pb2.FetchPackageRequest(sha256=sha256, node_name=self.config.node_name)
        try:
            async for msg in self._stub.FetchPackage(request):
                yield msg.data
        except grpc.aio.AioRpcError as exc:
            raise StartError(
                126, f"PackageUnavailable: {exc.code().name}: {exc.details()}"
            ) from None

    def _register(self) -> agent_pb2.Register:
        cap = self.capacity
        return agent_pb2.Register(
            node_name=self.config.node_name,
            address=self.address,
            capacity=node_pb2.NodeResources(
                cpu=cap.cpu_milli / 1000, memory=cap.memory_bytes, gpu=len(cap.gpus)
            ),
            gpus=[
                node_pb2.Gpu(
                    index=g.index, uuid=g.uuid, model=g.model, memory=g.memory_bytes, fake=g.fake
                )
                for g in cap.gpus
            ],
            labels=self.config.labels,
            pods=[pod_report(run) for run in self.supervisor.runs.values()],
            agent_version=arranger.__version__,
            runtimes=[runtime.description for runtime in self.supervisor.runtimes],
            gpu_sharing=sharing_message(self.gpu_sharing()),
            agent_id=self.membership.agent_id,
            kept_jobs=self.supervisor.files.kept_jobs(KEPT_JOBS_MOST),
            sent_at=time.time(),
            gpu_problems=problem_messages(gpu_problems(self.gpu_watch)),
        )

    def _registered(
        self, msg: agent_pb2.Registered, out: asyncio.Queue[agent_pb2.AgentMessage]
    ) -> None:
        self._timing(msg.heartbeat_interval_s, msg.fence_timeout_s)
        self.job_retention_s = msg.job_retention_s
        self._out = out
        # A heartbeat at once tells the server this agent accepts it: only then is the node
        # Ready there (an agent that refuses a server says nothing more to it).
        out.put_nowait(self._heartbeat())
        self.connected.set()
        log.info("registered", node=self.config.node_name, server=self.server)
        if self._pending:
            self._flush()

    def _heartbeat_ack(self, ack: agent_pb2.HeartbeatAck) -> None:
        """_heartbeat_ack takes the server's timing now (it stretches as the cluster grows);
        an ack without it (an older server's) changes nothing."""
        fence = ack.fence_timeout_s if ack.HasField("fence_timeout_s") else None
        self._timing(ack.heartbeat_interval_s, fence)

    def _timing(self, heartbeat_interval_s: float, fence_timeout_s: float | None) -> None:
        """_timing: the period before the next heartbeat (0: keep it) and the fence timeout
        (None: keep it; 0: never fence), as the server said."""
        if heartbeat_interval_s > 0:
            self.heartbeat_interval_s = heartbeat_interval_s
        if fence_timeout_s is not None and fence_timeout_s != self.contact.fence_timeout_s:
            self.contact.set_timeout(fence_timeout_s)

    async def _heartbeats(self, out: asyncio.Queue[agent_pb2.AgentMessage]) -> None:
        """_heartbeats sends one heartbeat each period, as the server last said it."""
        usage()  # the first CPU reading only starts the measurement
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            cpu, memory = usage()
            out.put_nowait(self._heartbeat(node_pb2.NodeUsage(cpu_percent=cpu, memory_used=memory)))

    def _heartbeat(self, node_usage: node_pb2.NodeUsage | None = None) -> agent_pb2.AgentMessage:
        """_heartbeat: a heartbeat, with the GPUs' health and what the node holds pods to now."""
        beat = agent_pb2.Heartbeat(
            usage=node_usage,
            sent_at=time.time(),
            gpu_problems=problem_messages(gpu_problems(self.gpu_watch)),
            gpu_sharing=sharing_message(self.gpu_sharing()),
        )
        return agent_pb2.AgentMessage(heartbeat=beat)

    async def _silence(self, call: Any) -> None:
        """_silence ends the session when the server has not answered for SILENT_PERIODS
        heartbeat periods and SILENT_MARGIN_S more (it acknowledges every heartbeat): a server
        frozen or cut off keeps the connection open, and the agent must move on to the
        server that took its place."""
        while True:
            limit = SILENT_PERIODS * self.heartbeat_interval_s + SILENT_MARGIN_S
            await asyncio.sleep(self.heartbeat_interval_s)
            silent = self.contact.silent_s()
            if silent > limit:
                self._silenced = f"the server at {self.server} was silent for {silent:.1f} s"
                log.warning(
                    "server silent: trying the next", server=self.server, silent_s=round(silent, 1)
                )
                call.cancel()
                return

    async def _resyncs(self, out: asyncio.Queue[agent_pb2.AgentMessage]) -> None:
        """_resyncs sends every pod's state now and then, so the server notices lost orders:
        every resync period (see resync_period_s); and removes what has aged past the job
        retention of jobs the server has no record of."""
        while True:
            await asyncio.sleep(
                resync_period_s(self.config.resync_interval_s, self.heartbeat_interval_s)
            )
            reports = [pod_report(run) for run in self.supervisor.runs.values()]
            out.put_nowait(
                agent_pb2.AgentMessage(pod_reports=agent_pb2.PodReports(reports=reports, full=True))
            )
            self.purge_unknown(())

    async def _usage(self, out: asyncio.Queue[agent_pb2.AgentMessage]) -> None:
        """_usage samples every running attempt's usage (off the event loop: it reads /proc)
        and sends it in one message, every usage_interval_s or every heartbeat period if that
        is longer: the server stretches the period as the cluster grows, and so the reports
        of all agents together stay as bounded as their heartbeats."""
        while self.config.usage_interval_s > 0:
            await asyncio.sleep(max(self.config.usage_interval_s, self.heartbeat_interval_s))
            uses = await self._sample_usage()
            if uses:
                out.put_nowait(agent_pb2.AgentMessage(usage=usage_report(uses)))

    # Orders and reports.

    def _commands(self, commands: agent_pb2.Commands) -> None:
        if not self.membership.current(commands.epoch):
            log.warning(
                "orders of an older server refused",
                epoch=commands.epoch,
                obeyed_epoch=self.membership.epoch,
            )
            return
        for launch in commands.launch:
            self.supervisor.launch(launch_order(launch))
        for kill in commands.kill:
            self.supervisor.kill(kill_order(kill))
        for uid in commands.forget_pods:
            self.supervisor.forget(uid)
        for job_id in commands.purge_jobs:
            self.supervisor.purge(job_id)
        self.purge_unknown(commands.purge_unknown_jobs)

    def _on_change(self, run: PodRun) -> None:
        """_on_change batches reports: every change in one loop turn goes in one message."""
        self._pending[run.uid] = run
        self.metrics.changed(run)
        if self._out is not None and not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out is None or not self._pending:
            return
        reports = [pod_report(run) for run in self._pending.values()]
        self._pending.clear()
        self._out.put_nowait(
            agent_pb2.AgentMessage(pod_reports=agent_pb2.PodReports(reports=reports))
        )

    def _start_log(
        self, request: agent_pb2.LogRequest, out: asyncio.Queue[agent_pb2.AgentMessage]
    ) -> None:
        self._spawn(self._send_log(request, out))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """_spawn runs work for the server (a log read, a command) until the session ends."""
        task = asyncio.create_task(work)
        self._log_tasks.add(task)
        task.add_done_callback(self._log_tasks.discard)

    async def _exec(self, order: agent_pb2.ExecOrder, stub: AgentStub) -> None:
        """_exec runs an ExecOrder's command over a call of its own (see exec_session). The
        call is read by a task of its own to its end: a read cancelled would cancel the call."""
        call = stub.Exec()
        hello = agent_pb2.ExecHello(exec_id=order.exec_id, node_name=self.config.node_name)
        given: asyncio.Queue[Input] = asyncio.Queue(INPUTS_HELD)
        gone = asyncio.Event()  # the server ended the call, or said its caller went
        self._execs[order.exec_id] = gone

        async def receive() -> None:
            try:
                async for m in call:
                    size = m.resize
                    await given.put(Input(m.input, m.input_closed, size.rows, size.cols))
            finally:
                gone.set()

        async def inputs() -> AsyncIterator[Input]:
            while True:
                yield await given.get()

        writing = asyncio.Lock()  # stdout and stderr are read apart: one write at a time

        async def send(stream: str, data: bytes) -> None:
            msg = agent_pb2.ExecFromAgent()
            setattr(msg, stream, data)
            async with writing:
                await call.write(msg)

        key, size = f"{order.pod_uid}.{order.attempt}", order.size
        command = ExecCommand(key, order.command, order.tty, order.stdin, size.rows, size.cols)
        call.add_done_callback(lambda _: gone.set())  # ended while `receive` waits on `given`
        receiving = asyncio.create_task(receive())
        draining: asyncio.Task[None] | None = None
        try:
            await call.write(agent_pb2.ExecFromAgent(hello=hello))
            code, why = await exec_session.serve(self.supervisor, command, inputs(), send, gone)
            draining = asyncio.create_task(
                exec_session.emptied(given)
            )  # unread input holds no call
            ended = job_pb2.ExecEnded(exit_code=code, message=why)
            async with writing:
                await call.write(agent_pb2.ExecFromAgent(ended=ended))
            await call.done_writing()
            async with asyncio.timeout(ENDED_S):  # the server has read it all
                await call.code()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, TimeoutError) as exc:
            log.info("exec call ended", pod=key, error=str(exc) or type(exc).__name__)

        finally:
            self._execs.pop(order.exec_id, None)
            call.cancel()
            await asyncio.gather(receiving, return_exceptions=True)
            if draining is not None:
                draining.cancel()

    async def _send_log(
        self, request: agent_pb2.LogRequest, out: asyncio.Queue[agent_pb2.AgentMessage]
    ) -> None:
        reply = agent_pb2.LogData(request_id=request.request_id)
        try:
            chunk = await self._read_log(
                request.pod_uid, request.attempt, request.offset, request.max_bytes, request.wait_s
            )
        except OSError as exc:
            reply.error = f"no log for attempt {request.attempt}: {exc.strerror or exc}"
        else:
            reply.data, reply.next_offset, reply.ended = chunk.data, chunk.next_offset, chunk.ended
            reply.dropped_bytes = chunk.dropped_bytes
        out.put_nowait(agent_pb2.AgentMessage(log_data=reply))


async def _drain(
    queue: asyncio.Queue[agent_pb2.AgentMessage],
) -> AsyncIterator[agent_pb2.AgentMessage]:
    while True:
        yield await queue.get()


def resync_period_s(resync_interval_s: float, heartbeat_interval_s: float) -> float:
    """resync_period_s: how often an agent sends its full pod list: its resync interval (30 s), or
    RESYNC_PERIODS heartbeat periods when that is longer. The server stretches the period as
    the cluster grows, so the full lists of all agents together stay as bounded as their
    heartbeats (at 5,000 agents: one every 300-375 s each, about 15 a second, not 167)."""
    return max(resync_interval_s, RESYNC_PERIODS * heartbeat_interval_s)
