"""evictions: the plan's evictions carried out, at once or after a notice.

Workers above their job's minimum go back to Pending; if the minimum itself goes, the whole job
does, back to the Pending stage. Neither counts a restart, and each pod gets its job's
preemption grace between SIGTERM and SIGKILL.

A job with `evictionNoticeSeconds` is told first: its pods to go are marked with when their
SIGTERM is due (`evict_at`), which the job's watchers see (the learner's event stream), and the
eviction is carried out when the notice ends (`expire`). For the whole job, its learner may
answer that it has checkpointed (`confirm`), and the eviction goes ahead at once, as it does
when the learner has to leave its node (`leader_gone`); the job's events say what ended the
notice. While under notice the pods count for the scheduler as already stopping: the room they
hold is on its way to the job they were evicted for, so no other victims are taken for it, and
a later cycle does not take them again. The preemptor's room is free at most notice + grace
after the decision.

A notice lasts while the room is needed: once the job it was given for is placed, or is gone,
it is withdrawn (`withdraw`) and the pods run on.

A notice is kept in memory only: a server that restarts during one decides again (the pods run
on meanwhile; nothing is stopped by the restart).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from arranger.sched.plan import Claim, Eviction
from arranger.server.effects import Effects
from arranger.server.model import SCHEDULER, JobRecord, PodRecord
from arranger.server.scaling import PodSteps
from arranger.states import PodState, ScheduleState, Stage

# Checkpoint confirmations closer together than this (with no notice running) are kept once.
CHECKPOINT_STEP_S = 1.0

PREEMPTED = "Preempted"


class EvictionSteps(PodSteps, Protocol):
    """EvictionSteps: the controller's job steps an eviction takes."""

    def notice_of(self, job: JobRecord) -> float: ...

    def set_stage(
        self, job: JobRecord, stage: Stage, reason: str, message: str, now: float, fx: Effects
    ) -> None: ...


def evict(
    steps: EvictionSteps,
    jobs: Mapping[str, JobRecord],
    evictions: list[Eviction],
    now: float,
    fx: Effects,
    touched: dict[str, JobRecord],
) -> None:
    """evict carries out (or gives notice of) the plan's evictions; the jobs it changes are
    added to `touched`."""
    by_job: dict[str, list[Eviction]] = {}
    for eviction in evictions:
        by_job.setdefault(eviction.job_id, []).append(eviction)
    for job_id, taken in by_job.items():
        job = jobs.get(job_id)
        if job is None or not job.active:
            continue
        # A surplus worker chosen that a scale put in the minimum since is left running: its
        # job is not evicted whole for the room of one worker.
        joined = {e.pod for e in taken if e.in_minimum is False}
        pods = [job.pods[e.pod] for e in taken if e.pod in job.pods]
        pods = [p for p in pods if not (p.in_minimum and p.name in joined)]
        pods = [p for p in pods if p.state.holds_resources and not p.stopping]
        pods = [p for p in pods if p.evict_at is None]  # under notice already
        if not pods:
            continue
        touched[job.id] = job
        reason = taken[0].reason
        whole = any(p.in_minimum for p in pods)
        if whole:
            pods = [p for p in job.pods.values() if p.state.holds_resources]
        notice = steps.notice_of(job)
        placed = [p for p in pods if not p.live]  # nothing runs yet: nothing to tell
        if notice <= 0 or (whole and not job.leader.live) or len(placed) == len(pods):
            _go(steps, job, pods, whole, reason, now, fx)
            continue
        if not whole and placed:
            _go(steps, job, placed, False, reason, now, fx)
        _give_notice(job, [p for p in pods if p.live or whole], whole, reason, now + notice, fx)
        what = "the whole job" if whole else ", ".join(p.name for p in pods if p.live)
        answer = "; the learner may confirm a checkpoint to go sooner" if whole else ""
        fx.event(now, "EvictionNotice", f"{what} in {notice:g} s: {reason}{answer}", job)


def _give_notice(
    job: JobRecord, pods: list[PodRecord], whole: bool, why: str, at: float, fx: Effects
) -> None:
    """_give_notice marks the pods (and for the whole job, its leader: what marks a notice
    for the whole job) to be evicted at `at`; a notice already running keeps its end."""
    for pod in [*pods, job.leader] if whole else pods:
        if pod.evict_at is None or pod.evict_at > at:
            pod.evict_at, pod.evict_why = at, why
        fx.pods.add(pod.uid)
    fx.jobs.add(job.id)
    fx.schedule = True


def due(job: JobRecord) -> float | None:
    """due: when the job's earliest notice ends (None: none is running)."""
    return min((p.evict_at for p in _noticed(job) if p.evict_at is not None), default=None)


def expire(steps: EvictionSteps, job: JobRecord, now: float, fx: Effects) -> None:
    """expire carries out the evictions whose notice has ended: the whole job's when its
    leader's has, else those of the surplus workers whose has."""
    leader = job.leader
    whole = leader.evict_at is not None and leader.evict_at <= now
    noticed = _noticed(job)
    pods = (
        noticed if whole else [p for p in noticed if p.evict_at is not None and p.evict_at <= now]
    )
    if not pods:
        return
    what = "the whole job" if whole else ", ".join(p.name for p in pods)
    fx.event(now, "NoticeEnded", f"{what} evicted: the notice ended", job)
    why = f"{pods[0].evict_why}; evicted when its notice ended"
    _go(steps, job, pods, whole, why, now, fx)


class CheckpointSteps(EvictionSteps, Protocol):
    """CheckpointSteps: EvictionSteps, and the job's reconcile once its notice ended."""

    def reconcile(self, job: JobRecord, now: float, fx: Effects) -> None: ...


def checkpointed(steps: CheckpointSteps, job: JobRecord, now: float) -> Effects | None:
    """checkpointed: the job's learner has checkpointed, now. That is kept as the job's last
    checkpoint (of otherwise equal victims, the one losing least work goes first), and a
    notice of the whole job's eviction, if one runs, ends now. None when the job has ended
    (nothing is kept). Without a notice running, a confirmation within CHECKPOINT_STEP_S of
    the last one kept changes nothing: a learner confirming in a loop writes to the store at
    most that often."""
    if job.deleted or job.stage.finished:
        return None
    fx = Effects()
    noticed = job.active and job.leader.evict_at is not None
    last = job.checkpoint_time
    if not noticed and last is not None and 0 <= now - last < CHECKPOINT_STEP_S:
        return fx
    job.checkpoint_time = now
    fx.jobs.add(job.id)
    if confirm(steps, job, now, fx):
        steps.reconcile(job, now, fx)
    return fx


def confirm(steps: EvictionSteps, job: JobRecord, now: float, fx: Effects) -> bool:
    """confirm: the learner says it has checkpointed; a notice for the whole job ends now.
    False when no notice for the whole job is running."""
    leader = job.leader
    if leader.evict_at is None or not job.active:
        return False
    left = leader.evict_at - now
    pods = _noticed(job)
    message = f"the learner confirmed a checkpoint with {left:.1f} s of notice left; evicted"
    fx.event(now, "Checkpointed", message, job)
    why = f"{leader.evict_why}; evicted once the learner checkpointed ({left:.1f} s early)"
    _go(steps, job, pods, True, why, now, fx)
    return True


def withdraw(
    jobs: Mapping[str, JobRecord],
    before: tuple[Claim, ...],
    after: tuple[Claim, ...],
    now: float,
    fx: Effects,
) -> None:
    """withdraw: the notices given for claims that lapsed (the job they were freeing room
    for was placed, or is gone) are withdrawn, and the pods run on: nobody needs their room.
    A notice for the whole job is withdrawn whole, once its leader's claim has lapsed."""
    kept = {victim for claim in after for victim in claim.victims}
    lapsed: dict[str, set[str]] = {}
    for claim in before:
        for job_id, name in claim.victims:
            if (job_id, name) not in kept:
                lapsed.setdefault(job_id, set()).add(name)
    for job_id, names in lapsed.items():
        job = jobs.get(job_id)
        if job is None or not job.active:
            continue
        leader = job.leader
        if leader.evict_at is not None and leader.name not in names:
            continue  # the whole job still goes
        pods = [
            p
            for p in _noticed(job)
            if (job.id, p.name) not in kept and (leader.evict_at is not None or p.name in names)
        ]
        if not pods:
            continue
        for pod in pods:
            pod.end_notice()
            fx.pods.add(pod.uid)
        fx.jobs.add(job.id)
        what = "the whole job" if leader in pods else ", ".join(p.name for p in pods)
        fx.event(now, "NoticeWithdrawn", f"{what}: its room is no longer needed", job)


def leader_gone(steps: EvictionSteps, job: JobRecord, now: float, fx: Effects) -> bool:
    """leader_gone: the learner under a notice for the whole job must move to another node
    (its node was lost or drained): nothing is left to checkpoint, so the eviction is carried
    out now, instead of the job rescheduling to be evicted later. False when no notice for
    the whole job runs."""
    leader = job.leader
    if leader.evict_at is None:
        return False
    fx.event(now, "NoticeEnded", "the whole job evicted: its learner left its node", job)
    why = f"{leader.evict_why}; evicted when its learner left its node"
    _go(steps, job, _noticed(job), True, why, now, fx)
    return True


def attempt_ended(job: JobRecord, pod: PodRecord) -> None:
    """attempt_ended: the pod's attempt ended (it crashed, its node was lost or drained). A
    surplus worker's notice ends with it: its room is free, and a next attempt placed again
    is not taken by it. A notice for the whole job stays until the whole job goes."""
    if pod.evict_at is not None and job.leader.evict_at is None:
        pod.end_notice()


def _noticed(job: JobRecord) -> list[PodRecord]:
    """_noticed: the job's pods under notice (one that ended for good no longer is)."""
    return [p for p in job.pods.values() if p.evict_at is not None and not p.done]


def _go(
    steps: EvictionSteps,
    job: JobRecord,
    pods: list[PodRecord],
    whole: bool,
    reason: str,
    now: float,
    fx: Effects,
) -> None:
    """_go stops the pods now: the whole job back to Pending, or surplus workers back to the
    scheduler."""
    for pod in job.pods.values() if whole else pods:
        pod.end_notice()
    if whole:
        pods = [p for p in job.pods.values() if p.state.holds_resources]
        steps.set_stage(job, Stage.PENDING, PREEMPTED, reason, now, fx)
        job.schedule_state, job.waiting_since, job.leader_address = (
            ScheduleState.UNSCHEDULED,
            now,
            "",
        )
    else:
        pods = [p for p in pods if p.state.holds_resources]
        names = ", ".join(p.name for p in pods)
        if names:
            fx.event(now, PREEMPTED, f"{names} {reason}", job)
    grace = steps.grace_of(job)
    for pod in pods:
        fx.pods.add(pod.uid)
        if pod.state == PodState.PLACED:
            steps.unplace(pod)
        else:
            pod.requeue = SCHEDULER
            steps.kill(pod, PREEMPTED, False, fx, grace)
    fx.jobs.add(job.id)
    fx.schedule = True


def job_ended(job: JobRecord, fx: Effects) -> None:
    """job_ended: an eviction notice ends with its job; no eviction follows, and pods the job
    leaves running (cleanPodPolicy None) hold their room, not on its way to anyone."""
    for pod in job.pods.values():
        if pod.evict_at is not None:
            pod.end_notice()
            fx.pods.add(pod.uid)
