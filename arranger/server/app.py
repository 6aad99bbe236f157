"""app is arranger-server's I/O shell: gRPC, the store, the scheduling loop, agent links.

Every change follows one path: the controller mutates its records and returns Effects; `commit`
serialises the touched records, makes them durable (one transaction, group-committed with any
concurrent change), and only then sends orders to agents and news to watchers. Handlers run on
one event loop, so the controller is never entered concurrently.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import secrets
import time
from collections.abc import Callable

import grpc
import structlog

from arranger.identity import local_principal
from arranger.sched import Res, run_cycle
from arranger.security import Gatekeeper, OpenStreams, server_credentials
from arranger.server import reflection
from arranger.server.agent_link import AgentLink
from arranger.server.agent_service import AgentServicer
from arranger.server.api import ApiServicer
from arranger.server.clock import SteadyClock
from arranger.server.config import ServerConfig
from arranger.server.controller import Controller
from arranger.server.convert import (
    commands_of,
    spec_from_json,
    spec_to_json,
)
from arranger.server.effects import Effects
from arranger.server.heartbeats import Cadence
from arranger.server.history import record_before_history
from arranger.server.job_tokens import JobTokens
from arranger.server.leadership import Leadership
from arranger.server.limits import EventBudget, SubmitGate
from arranger.server.metering import Meter
from arranger.server.metrics import ServerFacts, ServerMetrics
from arranger.server.model import JobRecord
from arranger.server.node_holders import NodeHolders
from arranger.server.nodes import NodeRegistration, PodReport
from arranger.server.plan_check import stale_placements
from arranger.server.queues import UNCAPPED_DEFAULT, uncapped_default
from arranger.server.retention import prune_all
from arranger.server.rollback import roll_back
from arranger.server.snapshot import SchedulingState
from arranger.server.store import (
    Fenced,
    Store,
    StoreError,
    Unreachable,
    batch_of,
    open_store,
    store_path,
)
from arranger.server.store_health import StoreHealth
from arranger.server.timers import Timers
from arranger.server.tokens import Tokens
from arranger.server.transport import HEALTH_SERVICE, SERVICES, Health, server_options
from arranger.server.usage import UsageBook, with_usage
from arranger.server.watch import WatchHub, news_of
from arranger.server.web import WebPort
from arranger.server.writes import GroupCommit, batch_for
from arranger.spec import JobSpec
from arranger.states import NodeState
from arranger.v1 import agent_pb2, agent_pb2_grpc, arranger_pb2_grpc

log = structlog.get_logger("arranger.server")
STORE_RETRY_MAX_S = 10.0  # the longest wait between tries to reach a shared store
RETENTION_PERIOD_S = 3_600.0  # how often finished jobs and old records are pruned

Clock = Callable[[], float]


class ArrangerServer:
    """ArrangerServer runs until `stop()`; `port` is the bound port once `start()` returns."""

    def __init__(self, config: ServerConfig, clock: Clock | None = None) -> None:
        config.check()
        self.config = config
        self.clock: Clock = clock or SteadyClock()  # wall steps move no decision
        self.controller = Controller(
            dataclasses.replace(config.controller, replace_lost_pods=config.fence_timeout_s > 0)
        )
        self.links: dict[str, AgentLink] = {}
        self.node_holders = NodeHolders()  # which agent holds each node name
        # The scheduling core's input, kept.
        self.state = SchedulingState(self.controller, [config.scheduler.machine_group_label])
        self.heartbeats = Cadence(config)
        self.controller.node_timeout_s = self.heartbeats.node_timeout_s
        self.watch = WatchHub()
        # Jobs submitted whose commit has not yet told watchers: not listed until it has, so
        # that a listing never shows a job that is then ADDED again, or was never stored.
        self.unannounced: set[str] = set()
        self.cycles = 0
        self.deserved: dict[str, Res] = {}  # each queue's share at the last cycle
        self.port = 0
        self.agent_port = 0  # with TLS agents connect here, with a client certificate
        self._store: Store | None = None
        self._store_away = ""  # why a shared store cannot be reached now ("": it can)
        self._grpc: grpc.aio.Server | None = None
        self._wake = asyncio.Event()
        self._changed = True  # something changed that could change a decision since the last cycle
        self._cycle_due: float | None = None  # when time alone could change the last plan
        self._nodes_checked = -math.inf  # when node timeouts were last checked
        self.local = local_principal()  # every caller of an insecure or dev server
        self.streams = OpenStreams(config.limits.streams_per_user)
        self.tokens = Tokens(lambda: self._store, self.streams, self.clock)
        self.job_tokens = JobTokens(self.controller.view.job)
        self.submits = SubmitGate(config.limits, self._unfinished, self._kept)
        self.event_budget = EventBudget(config.limits)
        self.timers = Timers(self.controller.timer, config.schedule_period_s)
        self._last_cycle_s = 0.0  # how long the last scheduling cycle took, commit included
        self._last_cycle_at = -math.inf  # when it started (time.monotonic)
        self._tasks: list[asyncio.Task[None]] = []
        self.writes = GroupCommit(self._commit)  # see writes; `written` for reads of the store
        self._stopped = False
        self._serving = False  # active and loaded: calls are answered
        self._listening = False  # the ports are open
        self.leadership: Leadership | None = None
        self.stepped_down = asyncio.Event()  # set when this server lost its lease
        self._landed: set[str] = set()  # jobs whose failed write is found stored (see submit)
        self.usage = UsageBook()  # each live pod's latest usage sample (memory only)
        self.store_health = StoreHealth(self._say_writable, self._probe_store)
        self.metrics = ServerMetrics(
            ServerFacts(
                lambda: self.controller.view,
                lambda: self.deserved,
                lambda: self._serving,
                lambda: len(self.links),
                lambda: self.store_health.writable,
                lambda: self.store_health.failures,
                self._lease_remaining_s,
            )
        )
        self.web = WebPort(self)

    @property
    def store(self) -> Store:
        assert self._store is not None, "the server is not started"
        return self._store

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
            self._store = await self._open_store_when_reachable()
        ca = None if self.config.tls is None else self.config.tls.read()[0]
        self.job_tokens.open(self.store.job_key, self.config.api_for_pods(self.port), ca)
        if not self.config.needs_tokens and not _loopback(self.config.listen):
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
        # Renewed from now on, while the store loads: a load longer than a term must not cost
        # the lease.
        self._tasks.append(asyncio.create_task(self._lead(), name="leadership"))
        try:
            await self._load()  # a store that cannot be read stops the server before it serves
        except StoreError:
            if not self.leadership.lost.is_set():
                raise
        if not self.store.shared:
            await self._open_ports()
        if self.leadership.lost.is_set():
            return  # lost while loading: `stepped_down` is set, and serve() starts a standby
        self._serving = True
        await self._health.set(self.store_health.writable)
        self._tasks.append(asyncio.create_task(self._schedule_loop(), name="schedule-loop"))
        self._tasks.append(asyncio.create_task(self._retention_loop(), name="retention"))
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

    async def _open_store_when_reachable(self) -> Store:
        """_open_store_when_reachable opens a shared store, trying again while its database
        server cannot be reached (1 s, doubling to STORE_RETRY_MAX_S): a server whose
        PostgreSQL went away stays up, a standby, and takes the lease back when it can."""
        delay = 1.0
        while True:
            try:
                store = await self._open_store()
            except Unreachable as exc:
                self._store_away = str(exc)
                log.warning(
                    "the store is unreachable: waiting as a standby", error=str(exc), retry_s=delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, STORE_RETRY_MAX_S)
                continue
            self._store_away = ""
            return store

    async def _open_ports(self) -> None:
        assert self._grpc is not None
        await self._grpc.start()
        self._listening = True

    async def _load(self) -> None:
        """_load rebuilds the server's state from the store (it holds the lease)."""
        jobs, nodes = await self.store.load(spec_from_json)
        queues = await self.store.load_queues()
        if uncapped_default(queues):  # a cluster made before new ones were capped: say so
            log.warning(UNCAPPED_DEFAULT)
        reaped = self.controller.restore(jobs, nodes, self.clock(), queues)
        self.state.everything_changed()
        self.timers.changed(self.controller.jobs)
        # The agents of nodes Ready when the last run ended may hold the timing it told them
        # for that many agents: this run's never falls short of it.
        self.agents_connected(sum(node.state == NodeState.READY for node in nodes))
        self.submits.restore(self.controller.view.jobs())
        log.info("store loaded", store=self.store.url, jobs=len(jobs), nodes=len(nodes))
        await self.commit(reaped)
        await self._record_history_before_it_was_kept()

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
        for link in list(self.links.values()):
            link.close()
        self.stepped_down.set()

    def closed(self) -> str:
        """closed: why calls are refused now ("" while this server is active and loaded, and
        may still act on its lease)."""
        if self._serving and self.leadership is not None and self.leadership.holds():
            return ""
        if self._store_away:
            return f"this server waits, a standby, for its store: {self._store_away}"
        if self.leadership is None:
            return "this server is starting"
        return self.leadership.standby_reason() or "this server is loading its store"

    async def _record_history_before_it_was_kept(self) -> None:
        """_record_history_before_it_was_kept gives a history record to every finished job
        that has none: it finished before this server kept records (a store from an older
        version). Its usage is counted from its pods' last attempts, all that is known."""
        missing = await self.store.finished_without_history(-math.inf)
        records = [
            record_before_history(job)
            for job_id in missing
            if (job := self.controller.view.job(job_id)) is not None
        ]
        if records:
            await self.store.write(batch_of([], [], [], [], (), history=records))
            log.info(
                "history recorded for jobs that finished before it was kept", jobs=len(records)
            )

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
        server = grpc.aio.server(
            interceptors=interceptors,
            options=server_options(self.config.max_message_bytes),
        )
        arranger_pb2_grpc.add_ArrangerServicer_to_server(ApiServicer(self), server)
        agent_pb2_grpc.add_AgentServiceServicer_to_server(AgentServicer(self), server)
        self._health = Health(server, SERVICES)  # a standby is NOT_SERVING
        reflection.enable([*SERVICES, HEALTH_SERVICE], server)
        return server

    async def _retention_loop(self) -> None:
        """_retention_loop prunes at start and every RETENTION_PERIOD_S (see retention)."""
        while not self._stopped:
            try:
                await self.prune()
            except StoreError as exc:
                log.error("pruning not stored", error=str(exc))
            except Exception:
                log.exception("pruning failed")
            await asyncio.sleep(RETENTION_PERIOD_S)

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

    def _kept(self, job_id: str) -> bool:
        job = self.controller.view.job(job_id)
        return job is not None and not job.deleted

    def _unfinished(self, job_id: str) -> bool:
        job = self.controller.view.job(job_id)
        return job is not None and not job.deleted and not job.stage.finished

    async def stop(self, grace_s: float = 1.0) -> None:
        """stop ends the server; stopping a stopped server does nothing."""
        if self._stopped:
            return
        self._stopped = True
        await self.store_health.stop()
        # The lease is kept (renewed) until the last writes are drained: they still need it.
        leading = [task for task in self._tasks if task.get_name() == "leadership"]
        await _cancel([task for task in self._tasks if task not in leading])
        for link in list(self.links.values()):
            link.close()
        self.watch.close()
        if self._grpc is not None:
            await self._grpc.stop(grace_s)  # handlers end; their last commits are refused
        await self.writes.drained()
        await self.web.stop()
        await _cancel(leading)
        self._tasks.clear()
        if self._store is not None:
            if self.leadership is not None and self.leadership.holds():
                try:  # a standby need not wait for the lease to lapse
                    await self._store.release_lease()
                except StoreError as exc:
                    log.warning(
                        "the lease was not let go: a standby takes over when it lapses",
                        error=str(exc),
                    )
            await self._store.close()
        if self._listening:
            log.info("server stopped")

    # The one path for changes.

    def trigger(self) -> None:
        """trigger asks for a scheduling cycle soon (after the debounce)."""
        self._changed = True
        self._wake.set()

    async def commit(self, fx: Effects) -> None:
        """commit stores what the effects touched, then sends orders and news.

        Changes that arrive while the store is writing are written together, in one
        transaction, in the order they were made (see writes). It runs to the end even if its caller is cancelled (a client gave
        up, a stream closed): once the records are changed, the orders that go with them must
        go out.
        """
        if not fx:
            return
        if self._stopped:
            raise StoreError("the server is stopping; nothing more is stored")
        self._look_again(fx)  # the records changed now: the next snapshot must see it
        await asyncio.shield(self.writes.queue(fx))

    def _look_again(self, fx: Effects) -> None:
        """_look_again: the kept scheduling input and timers look at what `fx` touched."""
        self.state.changed(fx)
        self.timers.changed(fx.touched_jobs())

    async def _commit(self, fx: Effects) -> None:
        view = self.controller.view
        history = [with_usage(r, self.usage.totals.get(r.job_id)) for r in fx.history]
        batch = batch_for(view, fx, history, self.event_budget.admit(fx.events))
        news = news_of(self.controller.view, fx)
        try:
            await self.store.write(batch)
        except StoreError as exc:
            if isinstance(exc, Fenced) and self.leadership is not None:
                self.leadership.lose(str(exc))
            else:
                await self.store_health.refused(str(exc))
            await self._roll_back(fx, exc)
            self._look_again(fx)  # put back as stored: look at them again
            raise
        await self.store_health.taken()
        self.metrics.stored(fx, self.controller.view)
        self.usage.settle(fx.pods, fx.jobs | fx.removed.keys(), self.controller.view)
        for node in fx.disconnect:
            link = self.links.get(node)
            if link is not None:
                link.close()
        self._dispatch(fx)
        self.submits.settle(fx.jobs | fx.removed.keys())
        self.event_budget.forget(fx.removed)
        self.watch.publish(news)
        self.job_tokens.ended(
            [j for j in fx.jobs | fx.removed.keys() if not ((job := view.job(j)) and job.active)],
            self.streams,
        )  # stopped, deleted, finished or gone: the tokens of these jobs are refused from now
        self.unannounced.difference_update(fx.jobs)
        if fx.schedule:
            self.trigger()

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

    async def _roll_back(self, fx: Effects, error: StoreError) -> None:
        """_roll_back puts the records `fx` touched back as the store holds them: nothing of
        a change that was not stored stays in memory, and none of its orders go out."""
        log.error(
            "a change was not stored: memory is put back as the store holds it", error=str(error)
        )
        try:
            stored = await self.store.read_records(
                fx.jobs | set(fx.removed),
                fx.pods,
                fx.nodes,
                fx.queues | fx.removed_queues,
                spec_from_json,
            )
        except Exception:
            log.exception("cannot read the store back: the server stops taking changes")
            self.store.broken = self.store.broken or f"cannot read the store back: {error}"
            return
        roll_back(self.controller, fx, stored)
        # Jobs submitted by this change that the store holds all the same: the transaction
        # committed and only its answer was lost (a connection that broke at COMMIT).
        submitted = {e.job_id for e in fx.events if e.kind == "Submitted"}
        self._landed.update(submitted.intersection(stored.jobs))

    def _dispatch(self, fx: Effects) -> None:
        """_dispatch sends the orders of stored effects, each batch marked with this server's
        epoch; a server that may no longer act on its lease sends none."""
        if self.leadership is None or not self.leadership.holds():
            if fx.launches or fx.kills:
                log.error("orders not sent: this server does not hold the lease")
            return
        batches = commands_of(fx, self.links, self.leadership.epoch, self.job_tokens.pod_env)
        for node, commands in batches.items():
            link = self.links.get(node)
            if link is not None:
                link.send(agent_pb2.ServerMessage(commands=commands))

    # Stimuli from the API and agents.

    async def submit(self, spec: JobSpec, owner: str = "") -> JobRecord:
        job_id = secrets.token_hex(6)
        job, fx = self.controller.submit(job_id, spec, spec_to_json(spec), self.clock(), owner)
        self.unannounced.add(job_id)
        try:
            await self.commit(fx)
        except Exception:
            if job_id in self._landed:  # the write committed though its answer was lost
                self._landed.discard(job_id)
                self.unannounced.discard(job_id)
                log.warning("a submit's write landed though it was reported failed", job=job_id)
            else:  # not stored: forget it, so memory and the store agree and the client may retry
                if self.controller.view.job(job_id) is job:
                    self.controller.withdraw(job)
                self.unannounced.discard(job_id)
                raise
        self.submits.submitted(job)
        return job

    def agents_connected(self, count: int) -> None:
        """agents_connected: `count` agents are connected now. Heartbeats stretch as the most
        connected at once grows, and the node timeout with them (see heartbeats.Cadence)."""
        if self.heartbeats.grow(count):
            self.controller.node_timeout_s = self.heartbeats.node_timeout_s
            log.debug(
                "heartbeats stretched",
                agents=count,
                period_s=self.heartbeats.period_s,
                fence_timeout_s=self.heartbeats.fence_timeout_s,
                node_timeout_s=self.heartbeats.node_timeout_s,
            )

    async def agent_registered(self, reg: NodeRegistration, link: AgentLink) -> None:
        if self.closed():  # stepped down (or stopping) since the stream was admitted
            link.close()
            return
        old = self.links.get(reg.name)
        if old is not None and old is not link:
            old.close()
        self.links[reg.name] = link
        self.agents_connected(len(self.links))  # agents registering at once count each other
        fx = self.controller.node_registered(reg, self.clock())
        # The next periodic cycle (within schedulePeriodSeconds) looks at the node, not one
        # soon after each registration: a fleet that registers at once (a server restart)
        # costs a cycle a period, not a cycle over every node per agent.
        later, fx.schedule = fx.schedule, False
        await self.commit(fx)
        self._changed = self._changed or later

    def purge_unknown(self, link: AgentLink, kept: tuple[str, ...]) -> None:
        """purge_unknown: an agent that registers keeping directories of jobs this server no
        longer has (pruned or deleted while it was away) is told to remove them."""
        unknown = [job_id for job_id in kept if self.controller.view.job(job_id) is None]
        if not unknown or self.leadership is None or not self.leadership.holds():
            return
        log.info("purging jobs the server no longer has", node=link.node, jobs=len(unknown))
        commands = agent_pb2.Commands(purge_jobs=unknown, epoch=self.leadership.epoch)
        link.send(agent_pb2.ServerMessage(commands=commands))

    async def agent_disconnected(self, link: AgentLink) -> None:
        if self.links.get(link.node) is link:
            del self.links[link.node]
            if not self._stopped and not self.closed():  # a server stepping down writes nothing
                await self.commit(self.controller.node_disconnected(link.node, self.clock()))

    async def pod_reports(self, node: str, reports: list[PodReport], full: bool = False) -> None:
        now = self.clock()
        if full:
            await self.commit(self.controller.node_resync(node, reports, now))
        else:
            await self.commit(self.controller.pod_reports(node, reports, now))

    # The scheduling loop.

    async def _schedule_loop(self) -> None:
        """_schedule_loop: a cycle when something that could change a decision happened (a
        burst of them gathered into one), or at the earliest time the clock alone could change
        one; node timeouts are checked at least every schedulePeriodSeconds."""
        period = self.config.schedule_period_s
        while not self._stopped:
            now = self.clock()
            times = [t for t in (self.timers.next(now), self._cycle_due) if t is not None]
            wake_at = min(times, default=None)
            timeout = period if wake_at is None else max(0.0, min(period, wake_at - now))
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
            # that arrives as the event fires, and the server would never stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            if self._wake.is_set():
                self._wake.clear()
                # Gather a burst; under a flood, wait as long as the last cycle took (cycles
                # take at most half the server's time) and minCycleIntervalSeconds after it began.
                gap = self.config.min_cycle_interval_s - (time.monotonic() - self._last_cycle_at)
                await asyncio.sleep(max(self.config.schedule_debounce_s, self._last_cycle_s, gap))
            try:
                await self.run_cycle()
            except StoreError as exc:  # nothing of the cycle stays in memory, nothing is ordered
                log.error("scheduling cycle not stored", error=str(exc))
            except Exception:
                log.exception("scheduling cycle failed")

    async def run_cycle(self) -> None:
        """run_cycle: node timeouts, back-off launches, then one placement cycle, one commit."""
        started_cycle = time.perf_counter()
        self._last_cycle_at = time.monotonic()
        try:
            await self._cycle()
        finally:
            self._last_cycle_s = time.perf_counter() - started_cycle

    async def _cycle(self) -> None:
        """_cycle: node timeouts and the clock's stimuli, stored; then, if something changed or
        the last plan's wake time has come, one placement cycle over the kept snapshot, computed
        off the event loop (submits and reports are answered meanwhile), and its plan applied
        with a re-check of fit against what changed meanwhile."""
        now = self.clock()
        fx = Effects()
        if not 0 <= now - self._nodes_checked < self.config.schedule_period_s:
            # Every node is looked at once a period, not on every cycle: timeouts are far longer.
            self._nodes_checked = now
            fx = self.controller.check_nodes(now)
        timed = [job for job in map(self.controller.view.job, self.timers.due(now)) if job]
        fx.merge(self.controller.tick(now, timed))
        self._changed = self._changed or fx.schedule
        fx.schedule = False  # the cycle below sees what they released
        await self.commit(fx)
        due = self._cycle_due is not None and now >= self._cycle_due
        if not (self._changed or due):
            return
        cause = "change" if self._changed else "time"
        self._changed, self._cycle_due = False, None
        snapshot = self.state.snapshot(now)
        if not snapshot.jobs:
            return
        started = time.perf_counter()
        plan = await asyncio.to_thread(run_cycle, snapshot, self.config.scheduler)
        self.deserved = plan.deserved
        # Nomad's plan applier: what changed while the cycle ran (a node that left or shrank,
        # a pod it did not know of) may leave no room for a placement; that job's placements
        # are dropped, whole, and it is tried again in the next cycle.
        stale = stale_placements(self.controller, self.state, plan)
        applied = self.controller.apply_plan(plan, self.clock(), skip=stale)
        placed = sum(placement.job_id not in stale for placement in plan.placements)
        self.metrics.cycle(time.perf_counter() - started, placed, len(plan.evictions), cause)
        if plan.wake_at is not None:
            self._cycle_due = max(plan.wake_at, now + self.config.schedule_period_s)
        self.cycles += 1
        log.debug("cycle", jobs=len(snapshot.jobs), placed=placed)
        if stale:
            log.info("placements no longer fit, tried again", jobs=len(stale))
            self.trigger()
        applied.schedule = False  # this cycle has seen everything released so far
        await self.commit(applied)


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    """_cancel cancels the tasks and waits until each has ended."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _loopback(listen: str) -> bool:
    host = listen.rpartition(":")[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")
