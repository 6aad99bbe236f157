"""schedule_loop: when the server runs a scheduling cycle, and how a plan is applied (DESIGN §4).

A cycle runs when something that could change a decision happened (a burst of them gathered
into one), or at the earliest time the clock alone could change one; node timeouts are checked
at least every schedulePeriodSeconds. The core plans on a snapshot, off the event loop, while
the server goes on taking changes; when the plan comes back it is re-checked against the
records as they are then (Nomad's plan applier): a node may have left, been cordoned, or come
back smaller meanwhile. What the pods on a node hold now comes from the kept scheduling state
(refreshed from what changed), so the check costs the plan's placements, not the pods on their
nodes. A job with a placement that no longer fits has its placements dropped, whole, and is
tried again in the next cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable

import structlog

from arranger.sched import GPU_MILLI, Plan, Res, run_cycle
from arranger.sched.plan import GpuShare
from arranger.server.config import ServerConfig
from arranger.server.controller import Controller
from arranger.server.effects import Effects
from arranger.server.metrics import ServerMetrics
from arranger.server.model import NodeRecord
from arranger.server.ports import Clock, Commit
from arranger.server.snapshot import SchedulingState
from arranger.server.store import StoreError
from arranger.server.timers import Timers

log = structlog.get_logger("arranger.server")

Wanted = list[tuple[str, int, int, tuple[GpuShare, ...]]]  # (job id, CPU, memory, GPU shares)


class ScheduleLoop:
    """ScheduleLoop runs cycles (see the module) until `stopped()` says so. `deserved` is each
    queue's share at the last cycle; `cycles` counts the cycles that ran the core."""

    def __init__(
        self,
        config: ServerConfig,
        clock: Clock,
        controller: Controller,
        state: SchedulingState,
        timers: Timers,
        commit: Commit,
        metrics: ServerMetrics,
        stopped: Callable[[], bool],
    ) -> None:
        self._config, self._clock, self._controller = config, clock, controller
        self._state, self._timers, self._commit = state, timers, commit
        self._metrics, self._stopped = metrics, stopped
        self.cycles = 0
        self.deserved: dict[str, Res] = {}
        self._wake = asyncio.Event()
        self._changed = True  # something changed that could change a decision since the last cycle
        self._cycle_due: float | None = None  # when time alone could change the last plan
        self._nodes_checked = -math.inf  # when node timeouts were last checked
        self._last_cycle_s = 0.0  # how long the last scheduling cycle took, commit included
        self._last_cycle_at = -math.inf  # when it started (time.monotonic)

    def trigger(self) -> None:
        """trigger asks for a scheduling cycle soon (after the debounce)."""
        self._changed = True
        self._wake.set()

    def changed(self, could_decide: bool = True) -> None:
        """changed: something changed that the next periodic cycle must look at, without
        asking for one sooner."""
        self._changed = self._changed or could_decide

    async def run(self) -> None:
        """run: cycles until the server stops (see the module)."""
        period = self._config.schedule_period_s
        while not self._stopped():
            now = self._clock()
            times = [t for t in (self._timers.next(now), self._cycle_due) if t is not None]
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
                gap = self._config.min_cycle_interval_s - (time.monotonic() - self._last_cycle_at)
                await asyncio.sleep(max(self._config.schedule_debounce_s, self._last_cycle_s, gap))
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
        controller, config = self._controller, self._config
        now = self._clock()
        fx = Effects()
        if not 0 <= now - self._nodes_checked < config.schedule_period_s:
            # Every node is looked at once a period, not on every cycle: timeouts are far longer.
            self._nodes_checked = now
            fx = controller.check_nodes(now)
        timed = [job for job in map(controller.view.job, self._timers.due(now)) if job]
        fx.merge(controller.tick(now, timed))
        self._changed = self._changed or fx.schedule
        fx.schedule = False  # the cycle below sees what they released
        await self._commit(fx)
        due = self._cycle_due is not None and now >= self._cycle_due
        if not (self._changed or due):
            return
        cause = "change" if self._changed else "time"
        self._changed, self._cycle_due = False, None
        snapshot = self._state.snapshot(now)
        if not snapshot.jobs:
            return
        started = time.perf_counter()
        plan = await asyncio.to_thread(run_cycle, snapshot, config.scheduler)
        self.deserved = plan.deserved
        stale = stale_placements(controller, self._state, plan)
        applied = controller.apply_plan(plan, self._clock(), skip=stale)
        placed = sum(placement.job_id not in stale for placement in plan.placements)
        self._metrics.cycle(time.perf_counter() - started, placed, len(plan.evictions), cause)
        if plan.wake_at is not None:
            self._cycle_due = max(plan.wake_at, now + config.schedule_period_s)
        self.cycles += 1
        log.debug("cycle", jobs=len(snapshot.jobs), placed=placed)
        if stale:
            log.info("placements no longer fit, tried again", jobs=len(stale))
            self.trigger()
        applied.schedule = False  # this cycle has seen everything released so far
        await self._commit(applied)


def stale_placements(controller: Controller, state: SchedulingState, plan: Plan) -> set[str]:
    """stale_placements: the jobs with a placement on a node that can no longer take it,
    as the records are now: the node left or takes no new pods, a GPU placed on has turned
    unhealthy, or what its pods hold plus the plan's placements there exceeds its CPU, memory
    or a GPU. `state` is the controller's kept scheduling state (told every change)."""
    wanted: dict[str, Wanted] = {}
    for placement in plan.placements:
        job = controller.view.job(placement.job_id)
        pod = job.pods.get(placement.pod) if job else None
        if job is None or pod is None:
            continue
        res = job.spec.template_of(pod.worker_set).resources
        wanted.setdefault(placement.node, []).append(
            (job.id, res.cpu_milli, res.memory_bytes, placement.gpus)
        )
    if wanted:
        state.refresh()
    stale: set[str] = set()
    for name, pods in wanted.items():
        node = controller.view.node(name)
        if node is None or not node.schedulable or not _room(state, node, pods):
            stale.update(job_id for job_id, *_ in pods)
    return stale


def _room(state: SchedulingState, node: NodeRecord, pods: Wanted) -> bool:
    """_room: whether the node holds what its pods hold now plus `pods` (CPU, memory, and
    each GPU up to one whole; none on an unhealthy GPU)."""
    cpu = state.cpu.get(node.name, 0) + sum(p[1] for p in pods)
    memory = state.memory.get(node.name, 0) + sum(p[2] for p in pods)
    gpus: dict[int, int] = {}
    for *_, shares in pods:
        for share in shares:
            gpus[share.index] = gpus.get(share.index, 0) + share.milli
    known = {g.index for g in node.gpus if not g.problem}
    return (
        cpu <= node.cpu_milli
        and memory <= node.memory_bytes
        and all(
            index in known and milli + state.gpus.get((node.name, index), 0) <= GPU_MILLI
            for index, milli in gpus.items()
        )
    )
