"""retention: finished jobs, their pods, events and logs go after `jobRetentionDays`, history
records after `historyRetentionDays`.

A prune takes at most `limit` finished jobs whose processes have all ended and that finished
before the cutoff, oldest first, out of memory; the commit that stores it deletes their rows
(their pods with them) and their events, a bounded batch of older events of jobs no longer in
the store and of history records past their own retention, tells watchers they are gone and
agents to purge their logs and scratch directories. Packages go with the last job that
refers to them; one no job names goes PACKAGE_UPLOAD_S after it was last uploaded or asked
for. The server repeats it until nothing is
left to prune, one transaction at a time, so its cost follows what it removes and no prune
holds the event loop for long.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable

import structlog

from arranger.server.controller import Controller
from arranger.server.effects import Effects, Pruning
from arranger.server.history import record_before_history
from arranger.server.model import EventRecord
from arranger.server.store import PRUNE_BATCH, Store, StoreError, batch_of
from arranger.server.view import ClusterView

log = structlog.get_logger("arranger.server")

DAY_S = 86_400.0
PACKAGE_UPLOAD_S = DAY_S  # a package no job names is kept this long after its last use
PRUNED = "Pruned"  # the event kind (never stored: the job's events go with it) watchers see
PRUNE_JOBS = 500  # jobs pruned in one transaction
RETENTION_PERIOD_S = 3_600.0  # how often finished jobs and old records are pruned


async def keep_pruning(prune: Callable[[], Awaitable[int]], stopped: Callable[[], bool]) -> None:
    """keep_pruning prunes at start and every RETENTION_PERIOD_S until `stopped()`."""
    while not stopped():
        try:
            await prune()
        except StoreError as exc:
            log.error("pruning not stored", error=str(exc))
        except Exception:
            log.exception("pruning failed")
        await asyncio.sleep(RETENTION_PERIOD_S)


async def record_missing_history(store: Store, view: ClusterView) -> None:
    """record_missing_history gives a history record to every finished job that has none:
    it finished before the server kept records (a store from an older version). Its usage is
    counted from its pods' last attempts, all that is known."""
    missing = await store.finished_without_history(-math.inf)
    records = [record_before_history(job) for job_id in missing if (job := view.job(job_id))]
    if records:
        await store.write(batch_of([], [], [], [], (), history=records))
        log.info("history recorded for jobs that finished before it was kept", jobs=len(records))


async def prune_all(
    controller: Controller,
    store: Store,
    commit: Callable[[Effects], Awaitable[None]],
    clock: Callable[[], float],
    jobs_s: float,
    history_s: float,
) -> int:
    """prune_all lets go of what retention no longer keeps, PRUNE_JOBS jobs (and a bounded
    batch of events and history records) a transaction, until nothing is left; then gives
    free pages back. Returns how many jobs went."""
    total = 0
    while True:
        fx, taken = prune(controller, clock(), jobs_s, history_s, PRUNE_JOBS)
        await commit(fx)
        total += taken
        if taken < PRUNE_JOBS and store.pruned_rows < PRUNE_BATCH:
            break
        await asyncio.sleep(0)  # let the server's other work in between
    await store.reclaim()
    if total:
        log.info("pruned finished jobs", jobs=total)
    return total


def prune(
    controller: Controller, now: float, jobs_s: float, history_s: float, limit: int
) -> tuple[Effects, int]:
    """prune removes up to `limit` finished jobs older than `jobs_s` from memory (an
    experiment's members once all of them are); returns the effects to commit and how many
    jobs it took (fewer than `limit`: none are left)."""
    cutoff = now - jobs_s
    # An experiment's members go once all are due (how it ended counts them all), so that
    # none is missing from it while another is kept.
    running = {
        job.experiment
        for job in controller.view.jobs()
        if job.experiment
        and not (job.stage.finished and job.finish_time is not None and job.finish_time < cutoff)
    }
    old = [
        job
        for job in controller.view.jobs()
        if job.stage.finished
        and job.finish_time is not None
        and job.finish_time < cutoff
        and not any(pod.live for pod in job.pods.values())
        and job.experiment not in running
    ]
    old.sort(key=lambda job: (job.finish_time or 0.0, job.id))
    taken = old[:limit]
    fx = Effects()
    for job in taken:
        controller.withdraw(job)
        fx.removed[job.id] = job
        fx.purges.append(job.id)
        fx.events.append(
            EventRecord(
                now, PRUNED, f"finished more than {jobs_s / DAY_S:g} days ago", job.id, job.name
            )
        )
    if taken:
        fx.events.append(
            EventRecord(
                now, PRUNED, f"{len(taken)} finished jobs older than {jobs_s / DAY_S:g} days pruned"
            )
        )
    fx.pruned = Pruning(
        jobs=tuple(job.id for job in taken),
        events_before=cutoff,
        history_before=now - history_s,
        packages=tuple(sorted({job.spec.package.sha256 for job in taken if job.spec.package})),
        packages_before=now - PACKAGE_UPLOAD_S,
    )
    return fx, len(taken)
