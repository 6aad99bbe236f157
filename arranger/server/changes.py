"""changes: the one path every change follows (DESIGN §5).

The controller mutates its records and returns Effects; `commit` hands them to the write queue
(writes.GroupCommit), which serialises the touched records and makes them durable in one
transaction, group-committed with any concurrent change; only then are orders sent to agents
and news to watchers. A write that fails puts memory back as the store holds it (rollback):
nothing of a change that was not stored stays in memory, and none of its orders go out.
Handlers run on one event loop, so the controller is never entered concurrently.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable

import structlog

from arranger.security import OpenStreams
from arranger.server import experiments
from arranger.server.agent_hub import AgentHub
from arranger.server.agent_messages import commands_of
from arranger.server.controller import Controller
from arranger.server.convert import spec_from_json, spec_to_json
from arranger.server.effects import Effects
from arranger.server.history import records_to_write
from arranger.server.job_tokens import JobTokens
from arranger.server.leadership import Leadership
from arranger.server.limits import EventBudget, SubmitGate
from arranger.server.metrics import ServerMetrics
from arranger.server.model import ExperimentRecord, JobRecord
from arranger.server.ports import Clock
from arranger.server.queues import UNCAPPED_DEFAULT, uncapped_default
from arranger.server.reports import ReportBook
from arranger.server.retention import record_missing_history
from arranger.server.rollback import put_back
from arranger.server.snapshot import SchedulingState
from arranger.server.store import Fenced, Store, StoreError
from arranger.server.store_health import StoreHealth
from arranger.server.timers import Timers
from arranger.server.usage import UsageBook, with_usage
from arranger.server.watch import WatchHub, news_of
from arranger.server.writes import GroupCommit, batch_for
from arranger.spec import JobSpec
from arranger.states import NodeState
from arranger.sweep import Members
from arranger.v1 import agent_pb2

log = structlog.get_logger("arranger.server")


class ChangePath:
    """ChangePath commits changes (see the module) and tells every part that keeps something
    of a record what was stored: the scheduling state and timers (before the write), the
    usage book, the limits, the watchers, the job tokens, the agents. `leadership()` is the
    server's lease (None before it is taken); `stopped()` says the server is stopping."""

    def __init__(
        self,
        controller: Controller,
        clock: Clock,
        store: Callable[[], Store],
        leadership: Callable[[], Leadership | None],
        store_health: StoreHealth,
        state: SchedulingState,
        timers: Timers,
        hub: AgentHub,
        watch: WatchHub,
        usage: UsageBook,
        submits: SubmitGate,
        event_budget: EventBudget,
        job_tokens: JobTokens,
        streams: OpenStreams,
        metrics: ServerMetrics,
        trigger: Callable[[], None],
        stopped: Callable[[], bool],
        reports: ReportBook | None = None,
    ) -> None:
        self._controller, self._clock, self._store, self._leadership = (
            controller,
            clock,
            store,
            leadership,
        )
        self._health, self._state, self._timers, self._hub = store_health, state, timers, hub
        self._watch, self._usage, self._submits, self._budget = watch, usage, submits, event_budget
        self._job_tokens, self._streams, self._metrics = job_tokens, streams, metrics
        self._trigger, self._stopped = trigger, stopped
        self._reports = reports if reports is not None else ReportBook()
        self.writes = GroupCommit(self._write)
        # Jobs submitted whose commit has not yet told watchers: not listed until it has, so
        # that a listing never shows a job that is then ADDED again, or was never stored.
        self.unannounced: set[str] = set()
        self._landed: set[str] = set()  # jobs whose failed write is found stored (see submit)

    async def load(self) -> None:
        """load rebuilds memory from the store (this server holds the lease): the records the
        controller keeps, and every part that keeps something of them, as a commit tells
        them; what the restore reaps is committed."""
        store, controller = self._store(), self._controller
        jobs, nodes = await store.load(spec_from_json)
        queues = await store.load_queues()
        if uncapped_default(queues):  # a cluster made before new ones were capped: say so
            log.warning(UNCAPPED_DEFAULT)
        stored = await store.load_experiments(spec_from_json)
        self._reports.load(await store.load_reports())  # charged below, with their jobs
        reaped = controller.restore(jobs, nodes, self._clock(), queues, stored)
        self._state.everything_changed()
        self._timers.changed(controller.jobs)
        # The agents of nodes Ready when the last run ended may hold the timing it told them
        # for that many agents: this run's never falls short of it.
        self._hub.connected(sum(node.state == NodeState.READY for node in nodes))
        self._submits.restore(controller.view.jobs())
        for job_id, size in self._reports.sizes():
            self._submits.grow(job_id, size)
        log.info("store loaded", store=store.url, jobs=len(jobs), nodes=len(nodes))
        await self.commit(reaped)
        await record_missing_history(store, controller.view)

    async def commit(self, fx: Effects) -> None:
        """commit stores what the effects touched, then sends orders and news.

        Changes that arrive while the store is writing are written together, in one
        transaction, in the order they were made (see writes). It runs to the end even if its
        caller is cancelled (a client gave up, a stream closed): once the records are changed,
        the orders that go with them must go out.
        """
        if not fx:
            return
        if self._stopped():
            raise StoreError("the server is stopping; nothing more is stored")
        if fx.ended:  # the jobs waiting for those: released, or failed, with the same write
            self._controller.settle(fx, self._clock())
        self._look_again(fx)  # the records changed now: the next snapshot must see it
        await asyncio.shield(self.writes.queue(fx))

    async def submit(self, spec: JobSpec, owner: str) -> JobRecord:
        """submit stores a new job of an admitted spec (StoreError: it is not stored, and
        memory has forgotten it, so that the client may try again)."""
        controller = self._controller
        job_id = secrets.token_hex(6)
        job, fx = controller.submit(job_id, spec, spec_to_json(spec), self._clock(), owner)
        self.unannounced.add(job_id)
        try:
            await self.commit(fx)
        except Exception:
            if job_id in self._landed:  # the write committed though its answer was lost
                self._landed.discard(job_id)
                self.unannounced.discard(job_id)
                log.warning("a submit's write landed though it was reported failed", job=job_id)
            else:  # not stored: forget it, so memory and the store agree and the client may retry
                if controller.view.job(job_id) is job:
                    controller.withdraw(job)
                self.unannounced.discard(job_id)
                raise
        self._submits.submitted(job)
        return job

    async def submit_experiment(self, spec: JobSpec, owner: str) -> ExperimentRecord:
        """submit_experiment stores a new experiment and its members (see experiments) in one
        write; as `submit`, one not stored is forgotten (StoreError)."""
        assert spec.sweep is not None
        controller, now = self._controller, self._clock()
        make = Members(spec)
        specs = []
        for index in range(spec.sweep.size):
            member = make.spec_of(index)
            specs.append((secrets.token_hex(6), member, spec_to_json(member)))
        exp = ExperimentRecord(secrets.token_hex(6), spec, spec_to_json(spec), now, owner)
        fx = controller.submit_experiment(exp, specs, now)
        ids = [job_id for job_id, _, _ in specs]
        self.unannounced.update(ids)
        try:
            await self.commit(fx)
        except Exception:
            landed = self._landed.intersection(ids)
            self._landed.difference_update(ids)
            self.unannounced.difference_update(ids)
            if not landed:  # not stored: forget all of it
                for job_id in ids:
                    job = controller.view.job(job_id)
                    if job is not None:
                        controller.withdraw(job)
                controller.experiments.pop(exp.id, None)
                raise
            log.warning("an experiment's write landed though it was reported failed", id=exp.id)
        for job in controller.view.members(exp):
            self._submits.submitted(job)
        return exp

    def _look_again(self, fx: Effects) -> None:
        """_look_again: the kept scheduling input and timers look at what `fx` touched."""
        self._state.changed(fx)
        self._timers.changed(fx.touched_jobs())

    async def _write(self, fx: Effects) -> None:
        """_write: one batch of the write queue, stored, then acted on."""
        view = self._controller.view
        # A job whose last pod ended now may have left memory with this change: fx.removed.
        made = records_to_write(fx.history, fx.rerecord, lambda j: view.job(j) or fx.removed.get(j))
        history = [with_usage(r, self._usage.totals.get(r.job_id)) for r in made]
        batch = batch_for(view, fx, history, self._budget.admit(fx.events))
        news = news_of(view, fx)
        store = self._store()
        try:
            await store.write(batch)
        except StoreError as exc:
            leadership = self._leadership()
            if isinstance(exc, Fenced) and leadership is not None:
                leadership.lose(str(exc))
            else:
                await self._health.refused(str(exc))
            self._landed.update(await put_back(store, self._controller, fx, exc))
            self._look_again(fx)  # put back as stored: look at them again
            raise
        await self._health.taken()
        self._metrics.stored(fx, view)
        ended = fx.jobs | fx.removed.keys()
        self._usage.settle(fx.pods, ended, view)
        for node in fx.disconnect:
            link = self._hub.links.get(node)
            if link is not None:
                link.close()
        self._dispatch(fx)
        self._submits.settle(ended)
        self._budget.forget(fx.removed)
        self._reports.forget(fx.removed)
        experiments.dropped(self._controller, fx.removed.values())
        self._watch.publish(news)
        self._job_tokens.ended(
            [j for j in ended if not ((job := view.job(j)) and job.active)], self._streams
        )  # stopped, deleted, finished or gone: the tokens of these jobs are refused from now
        self.unannounced.difference_update(fx.jobs)
        if fx.schedule:
            self._trigger()

    def _dispatch(self, fx: Effects) -> None:
        """_dispatch sends the orders of stored effects, each batch marked with this server's
        epoch; a server that may no longer act on its lease sends none."""
        leadership = self._leadership()
        if leadership is None or not leadership.holds():
            if fx.launches or fx.kills:
                log.error("orders not sent: this server does not hold the lease")
            return
        links = self._hub.links
        batches = commands_of(fx, links, leadership.epoch, self._job_tokens.pod_env)
        for node, commands in batches.items():
            link = links.get(node)
            if link is not None:
                link.send(agent_pb2.ServerMessage(commands=commands))
