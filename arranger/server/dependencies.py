"""dependencies: jobs that wait for others to end (spec.dependsOn, as Slurm's --dependency).

A job with dependencies is held out of scheduling (`JobRecord.waiting`, its message saying on
what) until each job it names has ended as its `when` says: `succeeded` (its outcome is
Completed: afterok), `finished` (any end: afterany), `failed` (outcome Failed: afternotok).
Once one has ended otherwise it never starts: it ends Failed, reason DependencyNeverMet, naming
the dependency, and what waits on it is settled in turn. A job is looked at when it is
submitted (`hold`), when it is read back from the store, at a load or after a write that
failed (`hold_as_stored`: only a job stored as held is held again, never one released), and
when a job it waits for ends (`settle`, over the jobs every change ended, through the index of
who waits for what). The names a submit gives are resolved to ids at admission, so a name used
again later does not change what a job waits for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from arranger.server import experiments, lifecycle
from arranger.server.effects import Effects
from arranger.server.history import COMPLETED, DELETED, FAILED, outcome_of
from arranger.server.model import ExperimentRecord, JobRecord
from arranger.spec import Dependency
from arranger.states import Stage

NEVER_MET = "DependencyNeverMet"
WAITING = "WaitingForDependencies"
MET = "DependenciesMet"
_VERB = {"succeeded": "succeed", "finished": "end", "failed": "fail"}


def ended_as(job: JobRecord | None) -> str:
    """ended_as: the outcome of a job that has ended ("" while it has not; Deleted for one no
    longer kept: it ended, and was pruned)."""
    if job is None:
        return DELETED
    if not (job.deleted or job.stage.finished):
        return ""
    return outcome_of(job.stage.value, job.reason, job.deleted and not job.stage.finished)


def met(dep: Dependency, outcome: str) -> bool:
    """met: whether a job that ended with `outcome` meets the dependency."""
    if dep.when == "finished":
        return True
    return outcome == (COMPLETED if dep.when == "succeeded" else FAILED)


def experiment_ended_as(exp: ExperimentRecord, jobs: Mapping[str, JobRecord]) -> str:
    """experiment_ended_as: "" while a member has not ended; else Completed if every member
    completed, Failed if one failed, else how the first of the others ended (Stopped,
    Deleted)."""
    outcomes = [ended_as(jobs.get(member)) for member in exp.members]
    if "" in outcomes:
        return ""
    if all(outcome == COMPLETED for outcome in outcomes):
        return COMPLETED
    if FAILED in outcomes:
        return FAILED
    return next(outcome for outcome in outcomes if outcome != COMPLETED)


def verdict(
    job: JobRecord,
    jobs: Mapping[str, JobRecord],
    experiments: Mapping[str, ExperimentRecord],
) -> tuple[str, str]:
    """verdict: MET (nothing to wait for), WAITING or NEVER_MET, and what the job's message
    says of it. A dependency on an experiment is on all its members: `succeeded` once every
    one completed, `failed` once all ended and one failed, `finished` once all ended."""
    waiting: list[str] = []
    for i, dep in enumerate(job.spec.depends_on):
        other = jobs.get(dep.job)
        exp = experiments.get(dep.job) if other is None else None
        if exp is not None:
            shown, outcome = f"experiment {exp.name} ({dep.job})", experiment_ended_as(exp, jobs)
        else:
            shown = f"job {other.name} ({dep.job})" if other is not None else f"job {dep.job}"
            outcome = ended_as(other)
        if not outcome:
            waiting.append(f"{shown} to {_VERB[dep.when]}")
        elif not met(dep, outcome):
            why = f"spec.dependsOn[{i}]: {shown} ended {outcome}, and it waited for it to"
            return NEVER_MET, f"{why} {_VERB[dep.when]}"
    if waiting:
        return WAITING, "waiting for " + "; ".join(waiting)
    return MET, ""


class Keeper(lifecycle.LifeSteps, Protocol):
    """Keeper: what holds the jobs (the controller): every job by id, those held here, and
    for each job waited for, who waits for it."""

    jobs: dict[str, JobRecord]
    waiting: set[str]
    waiters: dict[str, set[str]]
    experiments: dict[str, ExperimentRecord]


def hold(keeper: Keeper, job: JobRecord, now: float, fx: Effects) -> None:
    """hold holds a job just submitted while a job it depends on has not ended as it wants;
    one that never can start fails at once."""
    if not job.spec.depends_on or not job.active:
        return
    state, why = verdict(job, keeper.jobs, keeper.experiments)
    if state == NEVER_MET:
        lifecycle.finish(keeper, job, Stage.FAILED, NEVER_MET, why, now, fx)
    elif state == WAITING:
        _held(keeper, job, why)


def hold_as_stored(keeper: Keeper, job: JobRecord, now: float, fx: Effects | None) -> None:
    """hold_as_stored holds again a job read back from the store (a load, a write rolled back)
    that was held when stored: still Pending with reason WaitingForDependencies. A job once
    released is never held again, whatever became of what it waited for. With `fx` (a load),
    one whose dependency can no longer be met fails; one whose dependencies are all met is
    released."""
    _released(keeper, job)
    held = job.reason == WAITING and job.stage == Stage.PENDING and job.active
    if not held or not job.spec.depends_on:
        return
    state, why = verdict(job, keeper.jobs, keeper.experiments)
    if state == MET and fx is not None:
        _release(keeper, job, now, fx)
    elif state == NEVER_MET and fx is not None:
        lifecycle.finish(keeper, job, Stage.FAILED, NEVER_MET, why, now, fx)
    else:
        _held(keeper, job, why or job.message)


def settle(keeper: Keeper, fx: Effects, now: float) -> None:
    """settle looks, once jobs have ended in `fx`, at the jobs held for them: released once
    every dependency is met, failed once one never can be, and so on for what was held for
    those, all in `fx`. Jobs that are no longer held (stopped, deleted) are let go."""
    for job_id in list(keeper.waiting):
        gone = keeper.jobs.get(job_id)
        if gone is None or not gone.active:
            _released(keeper, gone, job_id)
    ended = set(fx.ended)
    while ended:
        # A job waiting on an experiment is looked at as each of its members ends.
        # (A member reaped with this change is in fx.removed only.)
        ended |= {
            job.experiment
            for e in ended
            if (job := keeper.jobs.get(e) or fx.removed.get(e)) and job.experiment
        }
        ids = sorted(set().union(*(keeper.waiters.get(e, set()) for e in ended)))
        ended = set()
        for job in [keeper.jobs[i] for i in ids]:
            state, why = verdict(job, keeper.jobs, keeper.experiments)
            fx.jobs.add(job.id)
            if state == WAITING:
                job.message = why
                continue
            _released(keeper, job)
            if state == NEVER_MET:
                lifecycle.finish(keeper, job, Stage.FAILED, NEVER_MET, why, now, fx)
                ended.add(job.id)
            else:
                _release(keeper, job, now, fx)


def forget(keeper: Keeper, job: JobRecord) -> None:
    """forget: the job has left memory (withdrawn, pruned): it is held for nothing."""
    _released(keeper, job)


def _held(keeper: Keeper, job: JobRecord, why: str) -> None:
    job.waiting = True
    keeper.waiting.add(job.id)
    for dep in job.spec.depends_on:
        keeper.waiters.setdefault(dep.job, set()).add(job.id)
    job.reason, job.message = WAITING, why


def _released(keeper: Keeper, job: JobRecord | None, job_id: str = "") -> None:
    """_released: the job is no longer held (nor indexed as a waiter)."""
    job_id = job.id if job is not None else job_id
    if job is not None:
        job.waiting = False
    if job_id not in keeper.waiting:
        return
    keeper.waiting.discard(job_id)
    keys = [d.job for d in job.spec.depends_on] if job is not None else list(keeper.waiters)
    for key in keys:
        waiters = keeper.waiters.get(key)
        if waiters is not None:
            waiters.discard(job_id)
            if not waiters:
                del keeper.waiters[key]


def _release(keeper: Keeper, job: JobRecord, now: float, fx: Effects) -> None:
    """_release lets a held job be scheduled: it waits from now (its scheduleTimeoutSeconds
    and the starvation guard count from here, not from its submit). A member of an
    experiment is held for its turn instead (its experiment lets it go: experiments.settle,
    which follows in the same change)."""
    fx.jobs.add(job.id)
    fx.event(now, MET, "every job it waited for ended as it wanted", job)
    if job.experiment:
        experiments.hold_turn(keeper.waiting, job, "waiting for its turn in its experiment")
        return
    job.reason, job.message = "Submitted", "waiting for the scheduler"
    job.waiting_since = now
    fx.schedule = True
