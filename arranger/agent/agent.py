"""agent is arranger-agent's I/O shell: the stream to the server, heartbeats, fencing.

The agent connects, registers with its capacity and every pod it still knows, then, once the
server has shown it serves this agent's cluster (see membership), carries out its orders and
reports each pod change. When the stream breaks it reconnects with
back-off; if it stays cut off for longer than the fence timeout it stops its pods, so the server
can safely start replacements elsewhere (and while no agent runs, the pods' shims do: see
fence).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc
import structlog
from aiohttp import web
from grpc import StatusCode

import arranger
from arranger.agent.accounts import Accounts
from arranger.agent.cgroups import Cgroups
from arranger.agent.config import AgentConfig, pod_user, route_address
from arranger.agent.devices import GpuNodes
from arranger.agent.discovery import Capacity, fake_gpus, machine_capacity, usage
from arranger.agent.fence import AgentLock, ServerContact
from arranger.agent.fence import files as fence_files
from arranger.agent.gpu_health import gpu_problems, watch_gpus
from arranger.agent.logs import read_chunk
from arranger.agent.membership import ForeignServer, Membership
from arranger.agent.metrics import AgentMetrics
from arranger.agent.mps import find_daemons
from arranger.agent.podman import PodmanRuntime, find_podman
from arranger.agent.process import FENCE_GRACE_S
from arranger.agent.runtime import StartError
from arranger.agent.supervisor import PodRun, Supervisor
from arranger.agent.usage import UsageSampler, nvml_probe, usage_report
from arranger.http_endpoint import EndpointError, HttpEndpoint, metrics_handler
from arranger.security import channel_credentials, loopback_credentials
from arranger.states import AGENT_STOPPED, FENCED, PodState
from arranger.v1 import agent_pb2, agent_pb2_grpc, node_pb2

if TYPE_CHECKING:
    from arranger.v1.agent_pb2_grpc import AgentServiceAsyncStub as AgentStub

log = structlog.get_logger("arranger.agent")

FENCE_CHECK_S = 0.5
STOP_GRACE_S = 5.0  # a pod's SIGTERM-to-SIGKILL time when the agent stops it as it exits
KEEPALIVE = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
SILENT_PERIODS = 3  # a server unheard for this many heartbeat periods (and the margin) is left
SILENT_MARGIN_S = 5.0
RESYNC_PERIODS = 6  # the full pod list goes at most once per this many heartbeat periods
STANDBY_SAYS = "the active server is"  # in a standby's refusal (see the server's leadership)
STANDBY_RETRY_S = 1.0  # the back-off's cap while a standby answers: it takes over within a term
# What the server says when it will not have this agent (a token or a node name it may not
# use, another agent holding its node name): said as a warning, naming the node.
REFUSALS = (StatusCode.PERMISSION_DENIED, StatusCode.UNAUTHENTICATED, StatusCode.ALREADY_EXISTS)
KEPT_JOBS_MOST = 100_000  # jobs named in one Register (their directories, for purging)
RECONNECT_FIRST_S = 0.1  # the back-off after a session ends; it doubles up to reconnect_max_s
RECONNECT_RESET_S = 30.0  # a session that lasted this long starts the back-off over
_RANDOM = random.Random()  # jitter draws leave the global generator's sequence alone


def reconnect_delay(backoff_s: float, rng: random.Random | None = None) -> float:
    """reconnect_delay is the wait before the next attempt to reach the server: between half
    of `backoff_s` and all of it, at random, so that agents cut off at once (a server restart)
    come back spread over the back-off, not all in the same instant at every attempt."""
    return backoff_s * (rng or _RANDOM).uniform(0.5, 1.0)


def capacity_of(config: AgentConfig, found: Capacity) -> Capacity:
    """capacity_of: what the agent reports: its share of the machine (as found, or as the
    config declares it), less the reserve, with any fake GPUs."""
    share = max(1, config.share)
    cpu_milli = config.capacity_cpu_milli or found.cpu_milli
    memory_bytes = config.capacity_memory_bytes or found.memory_bytes
    cpu = max(0, cpu_milli // share - config.reserve_cpu_milli)
    memory = max(0, memory_bytes // share - config.reserve_memory_bytes)
    gpus = found.gpus
    if config.fake_gpus:
        gpus = tuple(fake_gpus(config.fake_gpus, config.fake_gpu_model, config.node_name))
    return Capacity(cpu, memory, gpus)


class Agent:
    """Agent serves one node until `stop()`."""

    def __init__(self, config: AgentConfig, capacity: Capacity | None = None) -> None:
        """`capacity`, when given, replaces discovery, share and reserve (tests set exact sizes)."""
        self.config = config
        # The servers that share the cluster's store, one of them active: the agent moves on
        # to the next whenever a session ends (unreachable, a standby, a server that lost
        # its lease), and waits out its back-off only after trying each.
        self.servers = [s.strip() for s in config.server.split(",") if s.strip()]
        self._server_index = 0
        self._silenced = ""  # why the session was ended for the server's silence
        self.address = config.address or route_address(self.servers[0])
        self.capacity = (
            capacity if capacity is not None else capacity_of(config, machine_capacity())
        )
        self.gpu_nodes = GpuNodes.find({g.index: g.device_minor for g in self.capacity.gpus})
        cgroups, why = Cgroups.detect(config.node_name, config.limits, self.gpu_nodes)
        self.cgroups = cgroups
        self.why_no_cgroups = why
        accounts = Accounts(
            config.node_name, pod_user(config), config.run_as == "owner", config.run_as_root
        )
        mps_daemons, why_unheld = find_daemons(
            config.gpu_sharing, config.mps_control, config.data_dir, self.capacity.gpus
        )
        if config.gpu_sharing and mps_daemons is None:
            log.warning("GPU shares are not enforced here", reason=why_unheld)
        self.supervisor = Supervisor(
            config.node_name,
            self.address,
            config.data_dir,
            self._on_change,
            config.path_prepend,
            mps=config.mps,
            cgroups=cgroups,
            why_no_limits=why if config.limits else "turned off",
            pids=config.pids_limit,
            containers=self._containers(cgroups),
            accounts=accounts,
            max_log_bytes=config.max_log_bytes,
            fence=fence_files(config.data_dir),
            fetch_package=self._fetch_package,
            mps_daemons=mps_daemons,
        )
        self._warn_unheld()
        self.membership = Membership(config.data_dir)
        self.connected = asyncio.Event()
        self.last_error: str | None = None  # why the last session with the server ended
        self.lock = AgentLock(config.data_dir)
        self.contact = ServerContact(config.data_dir, config.fence_timeout_s)
        self.heartbeat_interval_s = config.heartbeat_interval_s
        self._out: asyncio.Queue[agent_pb2.AgentMessage] | None = None
        self._pending: dict[str, PodRun] = {}
        self._flush_scheduled = False
        self._log_tasks: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stub: AgentStub | None = None  # while admitted
        real_gpus = any(not gpu.fake for gpu in self.capacity.gpus)
        self.sampler = UsageSampler(nvml_probe() if real_gpus else None)
        self.gpu_watch = watch_gpus(self.capacity.gpus)  # None: no real GPU, or no NVML
        self.metrics = AgentMetrics(self.supervisor.runs.values, self.connected.is_set)
        self.web = _web(config.http_listen, self.metrics)

    def _warn_unheld(self) -> None:
        """_warn_unheld says, once as the agent starts, what this machine cannot hold pods to."""
        cgroups, why = self.cgroups, self.why_no_cgroups
        if self.config.limits and (cgroups is None or not cgroups.limits):
            reason = cgroups.lacking.get("memory", why) if cgroups else why
            log.warning("pods run without memory and CPU limits", reason=reason)
        if cgroups is None or "pids" not in cgroups.bases:
            reason = cgroups.lacking.get("pids", why) if cgroups else why
            log.warning("pods run without a pids limit", reason=reason)
        sharing = self.gpu_sharing()
        if not sharing.isolation and (self.capacity.gpus or self.gpu_nodes.gpu_minors):
            log.warning(
                "pods can open every GPU of this machine: no device filter",
                reason=sharing.isolation_detail,
            )

    def gpu_sharing(self) -> node_pb2.GpuSharing:
        """gpu_sharing: what this node holds pods to of their GPU grants. Shares are enforced
        where an MPS daemon holds each pod given one (gpuSharing: mps, the control program
        found, real GPUs) and none of those daemons is gone while its pod runs (see mps);
        elsewhere they are promised only. The device filter is held where cgroups give one."""
        cgroups = self.cgroups
        if cgroups is not None:
            detail, isolated = cgroups.isolation_detail, cgroups.isolates
        else:
            detail, isolated = self.why_no_cgroups, False
        daemons = self.supervisor.mps_daemons
        enforced = daemons is not None and daemons.enforcing()
        return node_pb2.GpuSharing(enforced=enforced, isolation=isolated, isolation_detail=detail)

    def _containers(self, cgroups: Cgroups | None) -> PodmanRuntime | None:
        """_containers: the runtime of pods that name an image, if podman works here."""
        if not self.config.podman:
            return None
        podman, why = find_podman(self.config.podman)
        if podman is None:
            log.info("pods that name an image cannot run here", reason=why)
            return None
        uuids = {g.index: g.uuid for g in self.capacity.gpus if g.uuid and not g.fake}
        return PodmanRuntime(
            podman,
            self.config.node_name,
            cgroups is not None and cgroups.limits,
            uuids,
            self.config.image_pull,
            fence=fence_files(self.config.data_dir),
            pids=self.config.pids_limit,
            allowed_host_paths=self.config.allowed_host_paths,
        )

    # Lifecycle.

    def start(self) -> None:
        """start takes this data directory (raises fence.AgentRunning if another agent has
        it) and serves in a task until `stop()`."""
        self.lock.acquire()
        self._task = asyncio.create_task(self.run(), name=f"agent {self.config.node_name}")
        if self.gpu_watch is not None:
            self.gpu_watch.start()

    async def stop(self) -> None:
        """stop ends the agent (what SIGTERM and SIGINT do). Its pods run on and the next agent
        over the same data directory adopts them, unless `stop_pods_on_exit`: then each is
        stopped and ends Killed with reason AgentStopped, which the server, told by the next
        agent, answers by running it again without counting a restart."""
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.gpu_watch is not None:
            await asyncio.to_thread(self.gpu_watch.stop)
        if self.web is not None and self.web.port:
            await self.web.stop()
        if self.config.stop_pods_on_exit:
            await self.supervisor.shutdown(grace_s=STOP_GRACE_S, reason=AGENT_STOPPED)
        else:
            await self.supervisor.detach()
        self.lock.release()  # from here on, each pod's shim keeps the fence

    async def run(self) -> None:
        """run keeps a session with the server open, reconnecting with back-off."""
        if self.web is not None:
            try:
                await self.web.start()
                log.info("http listening", metrics=f"{self.web.url}/metrics")
            except EndpointError as exc:  # metrics are not worth a node: it serves on
                log.error("metrics are not served", error=str(exc))
        recovered = self.supervisor.recover()
        if recovered:
            states = Counter(run.state.value for run in recovered)
            log.info("runs of an earlier agent taken back", **states)
        backoff = RECONNECT_FIRST_S
        standby_seen = False  # a standby refused in this round: a takeover is near
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
                        standby_seen |= STANDBY_SAYS in (exc.details() or "")
                except (OSError, ConnectionError) as exc:
                    log.info("server unreachable", server=self.server, error=str(exc))
                except ForeignServer as exc:
                    self.last_error = str(exc)
                    log.warning("server refused: not this agent's", error=self.last_error)
                self.connected.clear()
                self._out = None
                if time.monotonic() - started > RECONNECT_RESET_S:
                    backoff = RECONNECT_FIRST_S
                self._server_index = (self._server_index + 1) % len(self.servers)
                if self._server_index == 0:  # each was tried: wait before the next round
                    await asyncio.sleep(reconnect_delay(backoff))
                    most = STANDBY_RETRY_S if standby_seen else self.config.reconnect_max_s
                    backoff = min(backoff * 2, most)
                    standby_seen = False
        finally:
            fence.cancel()

    @property
    def server(self) -> str:
        """server: the server this agent talks to, or tries next."""
        return self.servers[self._server_index]

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
        reg = agent_pb2.Register(
            node_name=self.config.node_name,
            address=self.address,
            labels=self.config.labels,
            agent_version=arranger.__version__,
            runtimes=[runtime.description for runtime in self.supervisor.runtimes],
            gpu_sharing=self.gpu_sharing(),
            agent_id=self.membership.agent_id,
            kept_jobs=self.supervisor.kept_jobs(KEPT_JOBS_MOST),
            sent_at=time.time(),
            gpu_problems=gpu_problems(self.gpu_watch),
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
        self._timing(msg.heartbeat_interval_s, msg.fence_timeout_s)
        self._out = out
        # A heartbeat at once tells the server this agent accepts it: only then is the node
        # Ready there (an agent that refuses a server says nothing more to it).
        beat = agent_pb2.Heartbeat(sent_at=time.time(), gpu_problems=gpu_problems(self.gpu_watch))
        beat.gpu_sharing.CopyFrom(self.gpu_sharing())
        out.put_nowait(agent_pb2.AgentMessage(heartbeat=beat))
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
            out.put_nowait(
                agent_pb2.AgentMessage(
                    heartbeat=agent_pb2.Heartbeat(
                        usage=node_pb2.NodeUsage(cpu_percent=cpu, memory_used=memory),
                        sent_at=time.time(),
                        gpu_problems=gpu_problems(self.gpu_watch),
                        gpu_sharing=self.gpu_sharing(),
                    )
                )
            )

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
        every resync period (see resync_period_s)."""
        while True:
            await asyncio.sleep(
                resync_period_s(self.config.resync_interval_s, self.heartbeat_interval_s)
            )
            reports = [run.report() for run in self.supervisor.runs.values()]
            out.put_nowait(
                agent_pb2.AgentMessage(pod_reports=agent_pb2.PodReports(reports=reports, full=True))
            )

    async def _usage(self, out: asyncio.Queue[agent_pb2.AgentMessage]) -> None:
        """_usage samples every running attempt's usage (off the event loop: it reads /proc)
        and sends it in one message, every usage_interval_s or every heartbeat period if that
        is longer: the server stretches the period as the cluster grows, and so the reports
        of all agents together stay as bounded as their heartbeats."""
        while self.config.usage_interval_s > 0:
            await asyncio.sleep(max(self.config.usage_interval_s, self.heartbeat_interval_s))
            roots = {
                (run.uid, run.attempt): run.pid
                for run in self.supervisor.runs.values()
                if run.state == PodState.RUNNING and run.pid > 0
            }
            if self.gpu_watch is not None:  # a rising uncorrectable ECC count: see gpu_health
                await asyncio.to_thread(self.gpu_watch.poll_ecc)
            uses = await asyncio.to_thread(self.sampler.sample, roots)
            self.metrics.usage = uses
            if uses:
                out.put_nowait(agent_pb2.AgentMessage(usage=usage_report(uses)))

    async def _fence_loop(self) -> None:
        """_fence_loop stops every pod once the server has not been heard for fenceTimeout:
        the server gives up on a node only later (nodeTimeout), so it never starts a
        replacement while the original may still run."""
        fenced = False
        while True:
            await asyncio.sleep(FENCE_CHECK_S)
            silent, timeout = self.contact.silent_s(), self.contact.fence_timeout_s
            if silent <= timeout or timeout <= 0:
                fenced = False
                continue
            if not fenced and any(not r.ended.is_set() for r in self.supervisor.runs.values()):
                log.warning("fencing: the server is silent, stopping pods", silent_s=round(silent))
                self.supervisor.stop_all(FENCE_GRACE_S, FENCED)
            fenced = True

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
        self.metrics.changed(run)
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

    def _start_log(
        self, request: agent_pb2.LogRequest, out: asyncio.Queue[agent_pb2.AgentMessage]
    ) -> None:
        task = asyncio.create_task(self._send_log(request, out))
        self._log_tasks.add(task)
        task.add_done_callback(self._log_tasks.discard)

    async def _send_log(
        self, request: agent_pb2.LogRequest, out: asyncio.Queue[agent_pb2.AgentMessage]
    ) -> None:
        path = self.supervisor.log_path(request.pod_uid, request.attempt)

        def running() -> bool:
            run = self.supervisor.runs.get(request.pod_uid)
            return run is not None and run.attempt == request.attempt and not run.ended.is_set()

        reply = agent_pb2.LogData(request_id=request.request_id)
        try:
            chunk = await read_chunk(
                path, request.offset, request.max_bytes, request.wait_s, running
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


def _web(listen: str, metrics: AgentMetrics) -> HttpEndpoint | None:
    """_web: the agent's HTTP port serving /metrics, if `listen` names one."""
    if not listen:
        return None
    app = web.Application()
    app.router.add_get("/metrics", metrics_handler(metrics.exposition))
    return HttpEndpoint(listen, "httpListen", app)


def resync_period_s(resync_interval_s: float, heartbeat_interval_s: float) -> float:
    """resync_period_s: how often an agent sends its full pod list: its resync interval (30 s), or
    RESYNC_PERIODS heartbeat periods when that is longer. The server stretches the period as
    the cluster grows, so the full lists of all agents together stay as bounded as their
    heartbeats (at 5,000 agents: one every 300-375 s each, about 15 a second, not 167)."""
    return max(resync_interval_s, RESYNC_PERIODS * heartbeat_interval_s)
