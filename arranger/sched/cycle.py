"""cycle runs one scheduling cycle: snapshot in, plan out, no I/O (DESIGN §4).

Order of work: every job's gang minimum in job order (allocate), then pods above the minimum in
the same order (backfill), then each job's schedule state. A job whose minimum did not fit is
checked against the empty cluster; if it cannot fit there either for `infeasible_timeout_s`,
it is ScheduledFailed.
"""

from __future__ import annotations

from arranger.sched import reasons
from arranger.sched.actions.allocate import minimum_pods, place_gang
from arranger.sched.actions.backfill import place_extras
from arranger.sched.config import SchedulerConfig
from arranger.sched.order import job_order_key
from arranger.sched.plan import JobDecision, Plan
from arranger.sched.scoring import binpack
from arranger.sched.session import Session
from arranger.sched.snapshot import JobInfo, Snapshot
from arranger.states import ScheduleState


def run_cycle(snapshot: Snapshot, config: SchedulerConfig | None = None) -> Plan:
    """run_cycle decides placements for the snapshot's pending pods."""
    config = config or SchedulerConfig()
    session = Session(snapshot.nodes, config)
    plan = Plan()
    jobs = sorted(snapshot.jobs, key=job_order_key)
    blocked: dict[str, str] = {}
    for job in jobs:
        pods = minimum_pods(job)
        if pods:
            why = place_gang(session, job, pods, binpack, plan)
            if why is not None:
                blocked[job.id] = why
    empty: Session | None = None
    for job in jobs:
        if job.id in blocked:
            empty = empty or Session(snapshot.nodes, config, empty=True)
            plan.decisions[job.id] = _blocked_decision(
                snapshot, config, empty, job, blocked[job.id]
            )
            continue
        left, why = place_extras(session, job, binpack, plan)
        if left:
            message = f"{left} pods above the minimum wait for resources: {why}"
            plan.decisions[job.id] = JobDecision(
                job.id, ScheduleState.SCHEDULED_PARTLY, reasons.WAITING_FOR_WORKERS, message
            )
        else:
            plan.decisions[job.id] = JobDecision(job.id, ScheduleState.SCHEDULED_SUCCEED)
    return plan


def _blocked_decision(
    snapshot: Snapshot, config: SchedulerConfig, empty: Session, job: JobInfo, why: str
) -> JobDecision:
    never = place_gang(empty, job, minimum_pods(job), binpack, plan=None)
    if never is None:
        return JobDecision(job.id, ScheduleState.UNSCHEDULED, reasons.UNSCHEDULABLE, why)
    since = job.infeasible_since if job.infeasible_since is not None else snapshot.now
    message = f"the gang minimum cannot fit even the empty cluster: {never}"
    state = (
        ScheduleState.SCHEDULED_FAILED
        if snapshot.now - since >= config.infeasible_timeout_s
        else ScheduleState.UNSCHEDULED
    )
    return JobDecision(job.id, state, reasons.INFEASIBLE, message, infeasible=True)
