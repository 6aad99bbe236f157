"""backfill places pods above a job's minimum, one at a time, wherever they fit."""

from __future__ import annotations

from arranger.sched import reasons
from arranger.sched.pick import Scorer, pick
from arranger.sched.plan import Plan
from arranger.sched.session import Session
from arranger.sched.snapshot import JobInfo
from arranger.sched.statement import Statement


def place_extras(session: Session, job: JobInfo, score: Scorer, plan: Plan) -> tuple[int, str]:
    """place_extras returns how many extra pods stayed unplaced and why the first of them did."""
    statement = Statement(session)
    left, why = 0, ""
    for pod in sorted((p for p in job.pending if not p.in_minimum), key=lambda p: p.rank):
        choice = pick(session, pod, score)
        if choice is None:
            if not why:
                why = reasons.render(
                    pod.name, len(session), session.misfit_counts(pod), pod.gpu_type
                )
            left += 1
            continue
        statement.allocate(job.id, pod, *choice)
        statement.commit(plan)
    return left, why
