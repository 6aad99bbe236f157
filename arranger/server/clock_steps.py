"""clock_steps: what the clock alone changes in a job (the controller's tick) and when it next
will (its timer, kept in arranger.server.timers): a placed pod's restart back-off passes, an
eviction notice ends, a watched pod's time without progress runs out (stalls), an auxiliary
set's time after its leader's end runs out (helper_roles), or the job runs past its
maxRuntimeSeconds. Pure: what it needs of the controller comes through LifeSteps."""

from __future__ import annotations

from arranger.server import evictions, helper_roles, lifecycle, stalls
from arranger.server.effects import Effects
from arranger.server.lifecycle import LifeSteps
from arranger.server.model import JobRecord
from arranger.states import PodState, Stage


def tick(steps: LifeSteps, job: JobRecord, now: float, fx: Effects) -> None:
    """tick does what the time `now` calls for in the job. Once its leader has ended, only
    its helpers' time after that counts: the job ends as the leader decided, whatever else
    falls due meanwhile (its maxRuntimeSeconds, a helper's stall, a notice)."""
    if helper_roles.leader_ended(job):
        if _time_came(job, now):
            lifecycle.reconcile(steps, job, now, fx)
        return
    deadline = job.deadline
    if deadline is not None and now >= deadline:
        message = f"ran longer than maxRuntimeSeconds ({job.spec.max_runtime_s:g})"
        lifecycle.finish(steps, job, Stage.FAILED, "MaxRuntimeExceeded", message, now, fx)
        return
    stall = stalls.due(job)
    if stall is not None and stall <= now:
        verdict = stalls.check(job, now, fx)
        if verdict.fail:
            lifecycle.finish(steps, job, Stage.FAILED, stalls.STALLED, verdict.fail, now, fx)
            return
        for pod in verdict.restart:
            steps.kill(pod, stalls.STALLED, False, fx)
    notice = evictions.due(job) if job.active else None
    if notice is not None and notice <= now:
        evictions.expire(steps, job, now, fx)
        lifecycle.reconcile(steps, job, now, fx)
    elif _time_came(job, now):
        lifecycle.reconcile(steps, job, now, fx)


def timer(job: JobRecord) -> float | None:
    """timer: the earliest time the clock alone changes the job; None if none."""
    if helper_roles.leader_ended(job):
        return min(helper_roles.deadlines(job), default=None)
    times = [p.not_before for p in job.pods.values() if p.state == PodState.PLACED]
    if (notice := evictions.due(job)) is not None:
        times.append(notice)
    if (stall := stalls.due(job)) is not None:
        times.append(stall)
    times.extend(helper_roles.deadlines(job))
    if not job.active:
        times.clear()
    if (deadline := job.deadline) is not None:
        times.append(deadline)
    return min(times, default=None)


def _time_came(job: JobRecord, now: float) -> bool:
    """_time_came: a placed pod's back-off has passed, or an auxiliary set's time after its
    leader's end."""
    if any(p.state == PodState.PLACED and p.not_before <= now for p in job.pods.values()):
        return True
    return any(at <= now for at in helper_roles.deadlines(job))
