"""app is arranger-server's shell: it builds the parts and runs their lives (DESIGN §5).

The parts: the controller (the state machine), the one path for changes (changes), the
scheduling loop (schedule_loop), the agents' links (agent_hub), the client API (api) and the
agent protocol (agent_service) on one gRPC endpoint (transport), the web port (web). Each is
handed the ports it uses (ports), never the server. `start` opens the store, takes the lease
(a standby waits for it), loads the store and serves; `stop` ends each part in turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import grpc
import structlog

from arranger.identity import local_principal
from arranger.security import Gatekeeper, OpenStreams, server_credentials
from arranger.server.admission import Admission
from arranger.server.agent_hub import AgentHub
from arranger.server.agent_link import AgentLink
from arranger.server.agent_service import AgentServicer
from arranger.server.api import ApiServicer
from arranger.server.changes import ChangePath
from arranger.server.clock import SteadyClock
from arranger.server.config import ServerConfig
from arranger.server.controller import Controller
from arranger.server.dashboard import Dashboard
from arranger.server.effects import Effects
from arranger.server.explain_api import Explainer
from arranger.server.heartbeats import Cadence
from arranger.server.idle_gpus import IdleWatch
from arranger.server.job_tokens import JobTokens
from arranger.server.leadership import Leadership, open_when_reachable, refusal
from arranger.server.limits import EventBudget, ListGate, SubmitGate
from arranger.server.metering import Meter
from arranger.server.metrics import ServerFacts, ServerMetrics
from arranger.server.model import ExperimentRecord, JobRecord
from arranger.server.packages import Packages
from arranger.server.ports import Clock
from arranger.server.reports import ReportBook
from arranger.server.retention import keep_pruning, prune_all
from arranger.server.schedule_loop import ScheduleLoop
from arranger.server.snapshot import SchedulingState
from arranger.server.store import (
    Store,
    StoreError,
    open_store,
    store_path,
)
from arranger.server.store_health import StoreHealth
from arranger.server.timers import Timers
from arranger.server.tokens import Tokens
from arranger.server.transport import grpc_server
from arranger.server.usage import UsageBook
from arranger.server.watch import WatchHub
from arranger.server.web import WebPort
from arranger.spec import JobSpec

log = structlog.get_logger("arranger.server")


class ArrangerServer:
    """ArrangerServer runs until `stop()`; `port` is the bound port once `start()` returns."""

    def __init__(self, config: ServerConfig, clock: Clock | None = None) -> None:
        config.check()
        self.config = config
        self.clock: Clock = clock or SteadyClock()  # wall steps move no decision
        self.controller = Controller(
            dataclasses.replace(config.controller, replace_lost_pods=config.fence_timeout_s > 0)
        )
        # The scheduling core's input, kept.
        self.state = SchedulingState(self.controller, [config.scheduler.machine_group_label])
        self.heartbeats = Cadence(config)
        self.controller.node_timeout_s = self.heartbeats.node_timeout_s
        self.watch = WatchHub()
        self.port = 0
        self.agent_port = 0  # with TLS agents connect here, with a client certificate
        self._store: Store | None = None
        self._store_away = ""  # why a shared store cannot be reached now ("": it can)
        self._grpc: grpc.aio.Server | None = None
        self.local = local_principal()  # every caller of an insecure or dev server
        self.streams = OpenStreams(config.limits.streams_per_user)
        self.tokens = Tokens(lambda: self._store, self.streams, self.clock)
        self.job_tokens = JobTokens(self.controller.view.job)
        self.submits = SubmitGate(
            config.limits, self.controller.view.is_unfinished, self.controller.view.is_kept
        )
        self.event_budget = EventBudget(config.limits)
        self.timers = Timers(self.controller.timer, config.schedule_period_s)
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = False
        self._serving = False  # active and loaded: calls are answered
        self._listening = False  # the ports are open
        self.leadership: Leadership | None = None
        self.stepped_down = asyncio.Event()  # set when this server lost its lease
        self.usage = UsageBook()  # each live pod's latest usage sample (memory only)
        # pods whose GPUs read idle (memory only; off unless idleGpuMinutes is set)
        self.idle = IdleWatch(self.usage, config.idle_gpu_s, config.idle_gpu_utilization)
        self.reports = ReportBook()  # each job's reported values, as stored
        self.store_health = StoreHealth(self._say_writable, self._probe_store)
        self.metrics = ServerMetrics(
            ServerFacts(
                lambda: self.controller.view,
                lambda: self.loop.deserved,
                lambda: self._serving,
                lambda: len(self.hub.links),
                lambda: self.store_health.writable,
                lambda: self.store_health.failures,
                self._lease_remaining_s,
            )
        )
        self.loop = ScheduleLoop(
            config,
            self.clock,
            self.controller,
            self.state,
            self.timers,
            self.commit,
            self.metrics,
            lambda: self._stopped,
        )
        self.hub = AgentHub(
            self.controller,
            self.heartbeats,
            self.clock,
            self.commit,
            self.closed,
            self._epoch,
            self.loop.changed,
        )
        self.hub.job_retention_s = config.job_retention_s
        self.changes = ChangePath(
            self.controller,
            self.clock,
            lambda: self.store,
            lambda: self.leadership,
            self.store_health,
            self.state,
            self.timers,
            self.hub,
            self.watch,
            self.usage,
            self.submits,
            self.event_budget,
            self.job_tokens,
            self.streams,
            self.metrics,
            self.loop.trigger,
            lambda: self._stopped,
            self.reports,
        )
        self.writes = self.changes.writes  # `written` for reads of the store
        dashboard = Dashboard(
            self.controller.view,
            self.tokens,
            self.config,
            self.local,
            self,
            self.usage,
            self.hub.links,
            lambda: self.loop.deserved,
            self.closed,
            self.clock,
            self.reports,
        )
        self.web = WebPort(config, self.metrics.exposition, dashboard)

    @property
    def store(self) -> Store:
        assert self._store is not None, "the server is not started"
        return self._store

    @property
    def links(self) -> dict[str, AgentLink]:
        """links: each connected agent's link, by node name."""
        return self.hub.links

    @property
    def cycles(self) -> int:
        return self.loop.cycles

    def trigger(self) -> None:
        """trigger asks for a scheduling cycle soon (after the debounce)."""
        self.loop.trigger()

    async def run_cycle(self) -> None:
        """run_cycle: one scheduling cycle now (see schedule_loop)."""
        await self.loop.run_cycle()

    async def written(self) -> None:
        """written: see ports.StoreReads."""
        await self.writes.written()

    def _epoch(self) -> int | None:
        """_epoch: this server's lease epoch while it may act on its lease, else None."""
        if self.leadership is None or not self.leadership.holds():
            return None
        return self.leadership.epoch

    def _servicers(self) -> tuple[ApiServicer, AgentServicer]:
        """_servicers: the client API and the agent protocol, each handed the ports it uses."""
        config, view = self.config, self.controller.view
        limits = config.limits

        def store() -> Store:
            return self.store

        packages = Packages(store, view, limits.package_bytes, limits.stored_package_bytes_per_user)
        api = ApiServicer(
            self.controller,
            self.commit,
            self.clock,
            Admission(view, self.controller.config, config, packages, self.submits),
            self.changes,
            self,
            packages,
            self.watch,
            self.usage,
            self.hub.links,
            lambda: self.loop.deserved,
            Explainer(self.state, config.scheduler, self.clock),
            ListGate(limits),
            reports=self.reports,
        )
        agents = AgentServicer(
            self.hub,
            self.commit,
            self.clock,
            store,
            Packages(store, view, limits.package_bytes),
            self.usage,
            self.metrics,
            config.tls is not None,
            api.execs,  # the commands run in pods, between the API and the agents
            self.idle,
        )
        return api, agents

    async def start(self) -> None:
        """start opens the store and the ports; on a shared store it then waits, a standby
        refusing every call, until it holds the lease; then it loads the store and serves. A
        shared store's server opens its ports first and waits for a database server that
        cannot be reached, answering as a standby (NOT_SERVING) meanwhile."""
        shared = store_path(self.config.store_url) is None
        if not shared:
            self._store = await self._open_store()
        self._grpc = self._make_grpc_server()
        if self.config.tls is None:
            self.port = self._grpc.add_insecure_port(self.config.listen)
            self.agent_port = self.port
        else:
            api, agents = server_credentials(self.config.tls)
            self.port = self._grpc.add_secure_port(self.config.listen, api)
            self.agent_port = self._grpc.add_secure_port(self.config.agent_listen_address, agents)
        if self.port == 0 or self.agent_port == 0:
            raise OSError(f"cannot listen on {self.config.listen}")
        if shared:
            await self._health.set(False)
            await self._open_ports()  # a standby answers, naming the active server, while it waits
            self._store = await open_when_reachable(self._open_store, self._away)
        ca = None if self.config.tls is None else self.config.tls.read()[0]
        self.job_tokens.open(self.store.job_key, self.config.api_for_pods(self.port), ca)
        if not self.config.needs_tokens and not self.config.loopback:
            log.warning(
                "serving without TLS or tokens beyond this machine: anyone who reaches "
                "the port may run processes on every node as admin",
                listen=self.config.listen,
            )
        self.leadership = Leadership(
            self.store, self.config.advertised(self.port), self.config.lease_s
        )
        await self._health.set(False)
        await self.web.start()  # a standby's metrics say so
        await self.leadership.take()
        # Renewed from now on, while the store loads (a longer load must not cost the lease).
        self._tasks.append(asyncio.create_task(self._lead(), name="leadership"))
        try:
            await self.changes.load()  # a store that cannot be read stops it before it serves
        except StoreError:
            if not self.leadership.lost.is_set():
                raise
        if not self.store.shared:
            await self._open_ports()
        if self.leadership.lost.is_set():
            return  # lost while loading: `stepped_down` is set, and serve() starts a standby
        self._serving = True
        await self._health.set(self.store_health.writable)
        self._tasks.append(asyncio.create_task(self.loop.run(), name="schedule-loop"))
        self._tasks.append(
            asyncio.create_task(keep_pruning(self.prune, lambda: self._stopped), name="retention")
        )
        if self.config.needs_tokens:
            self._tasks.append(
                asyncio.create_task(self.tokens.watch_revocations(), name="revocations")
            )
        self.trigger()
        log.info(
            "server listening",
            listen=self.config.listen,
            port=self.port,
            agent_port=self.agent_port,
            store=self.store.url,
        )

    async def _open_store(self) -> Store:
        return await open_store(
            self.config.store_url,
            create=self.config.init,
            exclusive=True,
            confirmed=self.config.migrate,
        )

    def _away(self, why: str) -> None:
        self._store_away = why

    async def _open_ports(self) -> None:
        assert self._grpc is not None
        await self._grpc.start()
        self._listening = True

    async def _lead(self) -> None:
        """_lead keeps the lease; a server that loses it stops ordering agents and ends their
        streams (they find the active server), and `stepped_down` is set."""
        assert self.leadership is not None
        keeping = asyncio.ensure_future(self.leadership.keep())
        try:
            await self.leadership.lost.wait()  # the term ran out, or a write was fenced
        finally:
            keeping.cancel()
        self._serving = False
        await self._health.set(False)
        self.hub.close_all()
        self.stepped_down.set()

    def closed(self) -> str:
        """closed: why calls are refused now (see leadership.refusal)."""
        return refusal(self.leadership, self._serving, self._store_away)

    def _make_grpc_server(self) -> grpc.aio.Server:
        identify = self.tokens.identify if self.config.needs_tokens else None
        gatekeeper = Gatekeeper(
            identify,
            self.local,
            self.streams,
            self.closed,
            self.job_tokens,
            agent_secret=self.config.agent_secret if self.config.tls is None else "",
        )
        interceptors = [Meter(self.metrics.call), gatekeeper]  # Meter first: refusals count
        server, self._health = grpc_server(
            interceptors, self.config.max_message_bytes, *self._servicers()
        )
        return server

    async def prune(self) -> int:
        """prune lets go of what retention no longer keeps (see retention.prune_all)."""
        config = self.config
        return await prune_all(
            self.controller,
            self.store,
            self.commit,
            self.clock,
            config.job_retention_s,
            config.history_retention_s,
        )

    async def stop(self, grace_s: float = 1.0) -> None:
        """stop ends the server; stopping a stopped server does nothing."""
        if self._stopped:
            return
        self._stopped = True
        self.hub.stopping = True
        await self.store_health.stop()
        # The lease is kept (renewed) until the last writes are drained: they still need it.
        leading = [task for task in self._tasks if task.get_name() == "leadership"]
        await _cancel([task for task in self._tasks if task not in leading])
        self.hub.close_all()
        self.watch.close()
        if self._grpc is not None:
            await self._grpc.stop(grace_s)  # handlers end; their last commits are refused
        await self.writes.drained()
        await self.web.stop()
        await _cancel(leading)
        self._tasks.clear()
        if self._store is not None:
            if self.leadership is not None:
                await self.leadership.release()
            await self._store.close()
        if self._listening:
            log.info("server stopped")

    async def commit(self, fx: Effects) -> None:
        """commit: see changes.ChangePath.commit."""
        await self.changes.commit(fx)

    async def submit(self, spec: JobSpec, owner: str = "") -> JobRecord:
        """submit: see changes.ChangePath.submit."""
        return await self.changes.submit(spec, owner)

    async def submit_experiment(self, spec: JobSpec, owner: str = "") -> ExperimentRecord:
        """submit_experiment: see changes.ChangePath.submit_experiment."""
        return await self.changes.submit_experiment(spec, owner)

    def _lease_remaining_s(self) -> float | None:
        """_lease_remaining_s: see Leadership.remaining_s (None before it is known)."""
        return self.leadership.remaining_s() if self.leadership is not None else None

    async def _say_writable(self, writable: bool) -> None:
        """_say_writable: health follows the store's writability while this server serves."""
        if self._serving and not self._stopped:
            await self._health.set(writable)

    async def _probe_store(self) -> None:
        """_probe_store: a small write, to learn whether the store takes writes again."""
        fx = Effects()
        fx.event(self.clock(), "StoreWritable", "the store takes writes again")
        await self.commit(fx)


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    """_cancel cancels the tasks and waits until each has ended."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
