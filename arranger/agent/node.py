"""node: the machine this agent serves pods on, as its config shapes it, and the agent's
shell over it apart from the wire.

What the agent reports (capacity_of), what it holds pods to of their GPU grants (gpu_sharing),
what it warns of once as it starts (warn_unheld), and the supervisor it runs pods with, over
the accounts, MPS daemons and container runtime this machine has (node_supervisor).
`NodeShell` holds them with the data directory's lock, the fence, usage sampling, the GPU
watch and the metrics endpoint, and starts and stops them; the Agent (agent.py) adds the
stream to the server, where protobuf is read and written.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

import structlog
from aiohttp import web

from arranger.agent.accounts import Accounts
from arranger.agent.cgroups import Cgroups
from arranger.agent.config import AgentConfig, pod_user, route_address
from arranger.agent.devices import GpuNodes
from arranger.agent.discovery import Capacity, fake_gpus, machine_capacity
from arranger.agent.fence import AgentLock, ServerContact
from arranger.agent.fence import files as fence_files
from arranger.agent.gpu_health import watch_gpus
from arranger.agent.logs import Chunk, read_chunk
from arranger.agent.metrics import AgentMetrics
from arranger.agent.mps import MpsDaemons, find_daemons
from arranger.agent.packages import Fetch
from arranger.agent.podman import find_podman
from arranger.agent.podman_runtime import PodmanRuntime
from arranger.agent.process import FENCE_GRACE_S
from arranger.agent.runs import PodRun
from arranger.agent.servers import Servers
from arranger.agent.supervisor import Supervisor
from arranger.agent.usage import PodUse, UsageSampler, nvml_probe
from arranger.http_endpoint import EndpointError, HttpEndpoint, metrics_handler
from arranger.states import AGENT_STOPPED, FENCED, PodState

log = structlog.get_logger("arranger.agent")

FENCE_CHECK_S = 0.5
STOP_GRACE_S = 5.0  # a pod's SIGTERM-to-SIGKILL time when the agent stops it as it exits


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


@dataclass(frozen=True)
class GpuSharing:
    """GpuSharing: what this node holds pods to of their GPU grants: shares (`enforced`) and
    the device filter (`isolation`, with why or why not in `isolation_detail`)."""

    enforced: bool
    isolation: bool
    isolation_detail: str


def gpu_sharing(
    cgroups: Cgroups | None, why_no_cgroups: str, daemons: MpsDaemons | None
) -> GpuSharing:
    """gpu_sharing: shares are enforced where an MPS daemon holds each pod given one
    (gpuSharing: mps, the control program found, real GPUs) and none of those daemons is gone
    while its pod runs (see mps); elsewhere they are promised only. The device filter is held
    where cgroups give one."""
    if cgroups is not None:
        detail, isolated = cgroups.isolation_detail, cgroups.isolates
    else:
        detail, isolated = why_no_cgroups, False
    enforced = daemons is not None and daemons.enforcing()
    return GpuSharing(enforced, isolated, detail)


def warn_unheld(
    config: AgentConfig,
    cgroups: Cgroups | None,
    why: str,
    sharing: GpuSharing,
    capacity: Capacity,
    gpu_nodes: GpuNodes,
) -> None:
    """warn_unheld says, once as the agent starts, what this machine cannot hold pods to."""
    if config.limits and (cgroups is None or not cgroups.limits):
        reason = cgroups.lacking.get("memory", why) if cgroups else why
        log.warning("pods run without memory and CPU limits", reason=reason)
    if cgroups is None or "pids" not in cgroups.bases:
        reason = cgroups.lacking.get("pids", why) if cgroups else why
        log.warning("pods run without a pids limit", reason=reason)
    if not sharing.isolation and (capacity.gpus or gpu_nodes.gpu_minors):
        log.warning(
            "pods can open every GPU of this machine: no device filter",
            reason=sharing.isolation_detail,
        )


def node_supervisor(
    config: AgentConfig,
    address: str,
    capacity: Capacity,
    cgroups: Cgroups | None,
    why_no_cgroups: str,
    on_change: Callable[[PodRun], None],
    fetch_package: Fetch,
) -> Supervisor:
    """node_supervisor: the supervisor of this node's pods, with the accounts they run as,
    the MPS daemons that hold their GPU shares and the container runtime, as configured and
    as this machine has them."""
    accounts = Accounts(
        config.node_name, pod_user(config), config.run_as == "owner", config.run_as_root
    )
    mps_daemons, why_unheld = find_daemons(
        config.gpu_sharing, config.mps_control, config.data_dir, capacity.gpus
    )
    if config.gpu_sharing and mps_daemons is None:
        log.warning("GPU shares are not enforced here", reason=why_unheld)
    return Supervisor(
        config.node_name,
        address,
        config.data_dir,
        on_change,
        config.path_prepend,
        mps=config.mps,
        cgroups=cgroups,
        why_no_limits=why_no_cgroups if config.limits else "turned off",
        pids=config.pids_limit,
        containers=container_runtime(config, cgroups),
        accounts=accounts,
        max_log_bytes=config.max_log_bytes,
        fence=fence_files(config.data_dir),
        fetch_package=fetch_package,
        mps_daemons=mps_daemons,
        gpu_uuids={g.index: g.uuid for g in capacity.gpus if g.uuid and not g.fake},
    )


def container_runtime(config: AgentConfig, cgroups: Cgroups | None) -> PodmanRuntime | None:
    """container_runtime: the runtime of pods that name an image, if podman works here."""
    if not config.podman:
        return None
    podman, why = find_podman(config.podman)
    if podman is None:
        log.info("pods that name an image cannot run here", reason=why)
        return None
    return PodmanRuntime(
        podman,
        config.node_name,
        cgroups is not None and cgroups.limits,
        config.image_pull,
        fence=fence_files(config.data_dir),
        pids=config.pids_limit,
        allowed_host_paths=config.allowed_host_paths,
    )


class NodeShell(ABC):
    """NodeShell is the agent apart from its stream to the server: this node's parts, its
    pods' supervisor, the lock and fence of its data directory, usage sampling, the GPU watch
    and the metrics endpoint. A subclass serves the server (`run`), hears of every pod change
    (`_on_change`) and fetches packages (`_fetch_package`)."""

    def __init__(self, config: AgentConfig, capacity: Capacity | None = None) -> None:
        """`capacity`, when given, replaces discovery, share and reserve (tests set exact sizes)."""
        self.config = config
        self.servers = Servers(config.server, config.reconnect_max_s)
        self.address = config.address or route_address(self.servers.all[0])
        self.capacity = (
            capacity if capacity is not None else capacity_of(config, machine_capacity())
        )
        self.gpu_nodes = GpuNodes.find({g.index: g.device_minor for g in self.capacity.gpus})
        cgroups, why = Cgroups.detect(config.node_name, config.limits, self.gpu_nodes)
        self.cgroups = cgroups
        self.why_no_cgroups = why
        self.supervisor = node_supervisor(
            config, self.address, self.capacity, cgroups, why, self._on_change, self._fetch_package
        )
        warn_unheld(config, cgroups, why, self.gpu_sharing(), self.capacity, self.gpu_nodes)
        self.connected = asyncio.Event()
        self.job_retention_s = 0.0  # the server's, as it registered this agent
        self._unknown: set[str] = set()  # jobs the server has no record of, kept here still
        self.lock = AgentLock(config.data_dir)
        self.contact = ServerContact(config.data_dir, config.fence_timeout_s)
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        real_gpus = any(not gpu.fake for gpu in self.capacity.gpus)
        self.sampler = UsageSampler(nvml_probe() if real_gpus else None)
        self.gpu_watch = watch_gpus(self.capacity.gpus)  # None: no real GPU, or no NVML
        self.metrics = AgentMetrics(self._current_runs, self.connected.is_set)
        self.web = _web(config.http_listen, self.metrics)

    @abstractmethod
    async def run(self) -> None:
        """run serves the server until the agent stops; it begins with `_begin`."""

    @abstractmethod
    def _on_change(self, run: PodRun) -> None:
        """_on_change is told of every change of a pod attempt."""

    @abstractmethod
    def _fetch_package(self, sha256: str) -> AsyncIterator[bytes]:
        """_fetch_package streams a job's package (see packages)."""

    def purge_unknown(self, jobs: Iterable[str]) -> None:
        """purge_unknown removes what is kept of `jobs`, and of those the server named before,
        that the server has no record of, once untouched for its job retention; the rest is
        looked at again at the next call (every resync)."""
        self._unknown.update(jobs)
        now = time.time()
        for job_id in list(self._unknown):
            if self.supervisor.files.untouched_s(job_id, now) >= self.job_retention_s:
                self.supervisor.purge(job_id)
                self._unknown.discard(job_id)

    def _current_runs(self) -> list[PodRun]:
        return list(self.supervisor.runs.values())

    def gpu_sharing(self) -> GpuSharing:
        """gpu_sharing: what this node holds pods to of their GPU grants now."""
        return gpu_sharing(self.cgroups, self.why_no_cgroups, self.supervisor.mps_daemons)

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

    async def _begin(self) -> None:
        """_begin serves metrics, if asked to, and takes back the runs of an earlier agent."""
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

    async def _read_log(
        self, uid: str, attempt: int, offset: int, max_bytes: int, wait_s: float
    ) -> Chunk:
        """_read_log: a chunk of the log of attempt `attempt` of pod `uid` (see
        logs.read_chunk); raises OSError where there is no such log."""

        def running() -> bool:
            run = self.supervisor.runs.get(uid)
            return run is not None and run.attempt == attempt and not run.ended.is_set()

        path = self.supervisor.files.log_path(uid, attempt)
        return await read_chunk(path, offset, max_bytes, wait_s, running)

    async def _sample_usage(self) -> list[PodUse]:
        """_sample_usage: every running attempt's usage, sampled off the event loop (it reads
        /proc), after a poll of the GPUs' ECC counts (a rising one: see gpu_health)."""
        roots = {
            (run.uid, run.attempt): run.pid
            for run in self.supervisor.runs.values()
            if run.state == PodState.RUNNING and run.pid > 0
        }
        if self.gpu_watch is not None:
            await asyncio.to_thread(self.gpu_watch.poll_ecc)
        uses = await asyncio.to_thread(self.sampler.sample, roots)
        self.metrics.usage = uses
        return uses


def _web(listen: str, metrics: AgentMetrics) -> HttpEndpoint | None:
    """_web: the agent's HTTP port serving /metrics, if `listen` names one."""
    if not listen:
        return None
    app = web.Application()
    app.router.add_get("/metrics", metrics_handler(metrics.exposition))
    return HttpEndpoint(listen, "httpListen", app)
