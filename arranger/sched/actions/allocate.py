"""allocate places each job's gang minimum, all of it or none of it, in job order."""

from __future__ import annotations

from arranger.sched import reasons
from arranger.sched.pick import Scorer, pick
from arranger.sched.plan import Plan
from arranger.sched.session import Session
from arranger.sched.snapshot import JobInfo, PodRequest
from arranger.sched.statement import Statement
from arranger.states import Role


def minimum_pods(job: JobInfo) -> list[PodRequest]:
    """minimum_pods: the job's pending pods of its gang minimum, leader first, then by rank."""
    return sorted(
        (p for p in job.pending if p.in_minimum), key=lambda p: (p.role != Role.LEADER, p.rank)
    )


def place_gang(
    session: Session, job: JobInfo, pods: list[PodRequest], score: Scorer, plan: Plan | None
) -> str | None:
    """place_gang places every pod or none; it returns None on success, else why not.

    With `plan` the placements are committed to it; without, they are always discarded (a
    what-if, e.g. on the empty cluster).
    """
    statement = Statement(session)
    for pod in pods:
        choice = pick(session, pod, score)
        if choice is None:
            why = reasons.render(pod.name, len(session), session.misfit_counts(pod), pod.gpu_type)
            statement.discard()
            return why
        statement.allocate(job.id, pod, *choice)
    if plan is None:
        statement.discard()
    else:
        statement.commit(plan)
    return None
