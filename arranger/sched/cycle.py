"""cycle runs one scheduling cycle: snapshot in, plan out, no I/O (DESIGN §4).

The configured actions run in order over one session; then each job with pods to place gets
its schedule state.
A job whose minimum waits and for which nothing is being evicted is told why: what preempt
and reclaim refused, or why they were not tried.
A job whose minimum was not placed is checked against the empty cluster: if it cannot fit
there either for `infeasible_timeout_s`, or it has waited past its scheduleTimeoutSeconds, it
is ScheduledFailed.
"""

from __future__ import annotations

from arranger.sched import actions as _actions  # noqa: F401 (registers the actions)
from arranger.sched import plugins as _plugins  # noqa: F401 (registers the plugins)
from arranger.sched import reasons
from arranger.sched.cluster import Snapshot
from arranger.sched.config import SchedulerConfig
from arranger.sched.framework import ACTIONS
from arranger.sched.placement import Misfit, place_all_or_nothing
from arranger.sched.plan import Claim, JobDecision, Plan, Refusal
from arranger.sched.session import Session
from arranger.sched.snapshot import JobInfo
from arranger.states import ScheduleState


def run_cycle(snapshot: Snapshot, config: SchedulerConfig | None = None) -> Plan:
    """run_cycle decides placements for the snapshot's pending pods."""
    session = Session(snapshot, config or SchedulerConfig())
    for name in session.config.actions:
        ACTIONS[name](session)
    session.release_claims()
    session.plan.claims = _claims(session)
    never_cache: dict[tuple[object, ...], Misfit | None] = {}
    for job in session.pending_jobs:
        if job.pending:  # a job with nothing to place keeps the state it has
            session.plan.decisions[job.id] = _decide(session, job, never_cache)
    session.plan.deserved = {name: q.deserved for name, q in session.queues.items()}
    session.plan.wake_at = _wake_at(session)
    return session.plan


def _claims(session: Session) -> list[Claim]:
    """_claims: the room still being freed after this cycle, per waiting job: the snapshot's
    claims whose job's minimum is still not placed, with their victims still stopping, and
    this cycle's evictions. A claim whose victims are all gone had its first go this cycle
    and is not carried further."""
    stopping = {(victim.id, pod.name) for victim, pod in session.terminating}
    victims: dict[str, list[tuple[str, str]]] = {}
    for claim in session.snapshot.claims:
        progress = session.progress.get(claim.job_id)
        if progress is None or progress.minimum_placed:
            continue
        left = [v for v in claim.victims if v in stopping]
        if left:
            victims.setdefault(claim.job_id, []).extend(left)
    for eviction in session.plan.evictions:
        victims.setdefault(eviction.for_job, []).append((eviction.job_id, eviction.pod))
    return [Claim(job_id, tuple(dict.fromkeys(v))) for job_id, v in victims.items()]


def _wake_at(session: Session) -> float | None:
    """_wake_at: when the same snapshot, later, could give another plan. A job whose minimum
    waits may reach the starvation threshold, its infeasible timeout or its schedule timeout;
    a reservation that took a node this cycle takes the next one in the next cycle; a victim
    passed over for its queue's minRunSeconds may be taken once it has run that long."""
    now, config, plan = session.now, session.config, session.plan
    times: list[float] = []
    if plan.reservation is not None and plan.reservation != session.snapshot.reservation:
        times.append(now)
    if session.protected_until is not None:  # a victim shielded by minRunSeconds comes free
        times.append(session.protected_until)
    for job in session.pending_jobs:
        decision = plan.decisions.get(job.id)
        if decision is None or session.progress[job.id].minimum_placed:
            continue
        if decision.state != ScheduleState.UNSCHEDULED:
            continue  # failed: nothing more to decide for it by time
        if decision.infeasible:
            since = job.infeasible_since if job.infeasible_since is not None else now
            times.append(since + config.infeasible_timeout_s)
            continue
        if job.schedule_timeout_s is not None:
            times.append(_waiting_from(job) + job.schedule_timeout_s)
        if "reserve" in config.actions and job.waiting_since is not None:
            starving = job.waiting_since + config.starvation_threshold_s
            if starving > now:
                times.append(starving)
    return min(times, default=None)


def _decide(
    session: Session, job: JobInfo, never_cache: dict[tuple[object, ...], Misfit | None]
) -> JobDecision:
    progress = session.progress[job.id]
    now, config = session.now, session.config
    if progress.minimum_placed:
        left, why = progress.extras_left, progress.extras_why
        if "backfill" not in config.actions:
            left, why = (
                len(session.extras(job)),
                "pods above the minimum are not placed (backfill is off)",
            )
        if left:
            message = f"{left} pods above the minimum wait for resources: {why}"
            return JobDecision(
                job.id, ScheduleState.SCHEDULED_PARTLY, reasons.WAITING_FOR_WORKERS, message
            )
        return JobDecision(job.id, ScheduleState.SCHEDULED_SUCCEED)
    why = progress.why or "waiting for its turn"
    never = why if progress.never else _never(session, job, never_cache)
    if never:
        since = job.infeasible_since if job.infeasible_since is not None else now
        state = (
            ScheduleState.SCHEDULED_FAILED
            if now - since >= config.infeasible_timeout_s
            else ScheduleState.UNSCHEDULED
        )
        message = f"the gang minimum cannot fit even the empty cluster: {never}"
        return JobDecision(job.id, state, reasons.INFEASIBLE, message, infeasible=True)
    if job.schedule_timeout_s is not None and now - _waiting_from(job) >= job.schedule_timeout_s:
        message = f"not placed within scheduleTimeoutSeconds ({job.schedule_timeout_s:g}): {why}"
        return JobDecision(
            job.id, ScheduleState.SCHEDULED_FAILED, reasons.SCHEDULE_TIMEOUT, message
        )
    code = progress.code or (
        reasons.QUEUE_CAPABILITY if why.startswith("queue ") else reasons.UNSCHEDULABLE
    )
    refused = _refusals(session, job)
    message = f"{why}; {refusal_words(refused)}" if refused else why
    return JobDecision(job.id, ScheduleState.UNSCHEDULED, code, message)


def refusal_words(refused: list[Refusal]) -> str:
    """refusal_words: "preempt refused (VictimNotLowerPriority): 2 running jobs not of lower
    priority; reclaim refused (...): ...", one clause for actions refused alike."""
    clauses: dict[tuple[str, str], list[str]] = {}
    for refusal in refused:
        clauses.setdefault((refusal.reason, refusal.message), []).append(refusal.action)
    return "; ".join(
        f"{' and '.join(actions)} {'not tried' if code == reasons.PREEMPTION_NOT_TRIED else 'refused'}"
        f" ({code}): {words}"
        for (code, words), actions in clauses.items()
    )


def _refusals(session: Session, job: JobInfo) -> list[Refusal]:
    """_refusals: why nothing was evicted for a job whose minimum waits: what preempt and
    reclaim refused, or, when neither tried, why not (recorded in the plan too)."""
    progress = session.progress[job.id]
    if progress.evicting or not session.minimum(job):
        return []
    if progress.refused:
        return progress.refused
    actions = session.config.actions
    if "preempt" not in actions and "reclaim" not in actions:
        why = "preempt and reclaim are not among the scheduler's actions"
    elif not progress.admitted:
        why = "it was not admitted (its queue is over its capability)"
    else:
        return []
    code = reasons.PREEMPTION_NOT_TRIED
    refusal = Refusal(job.id, "preempt", code, why)
    session.plan.refusals.append(refusal)
    return [refusal]


def _never(
    session: Session, job: JobInfo, cache: dict[tuple[object, ...], Misfit | None]
) -> str | None:
    """_never: why the minimum cannot fit even the empty cluster, or None if it could. Jobs of
    the same shape (and queue) share the answer."""
    minimum = session.minimum(job)
    if not minimum:
        return None
    shapes = tuple(p.shape for p in minimum)
    key = (job.queue, job.machine_group_only, shapes)
    if key not in cache:
        statement, misfit = place_all_or_nothing(session, job, minimum, nodes=session.empty_nodes())
        statement.discard()
        cache[key] = misfit
    found = cache[key]
    return found.message(minimum) if found else None


def _waiting_from(job: JobInfo) -> float:
    """_waiting_from: when the job's minimum started waiting (its submit, an eviction, its
    release by the jobs it depended on), from which scheduleTimeoutSeconds counts."""
    return job.waiting_since if job.waiting_since is not None else job.submit_time
