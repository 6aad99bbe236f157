"""backfill places pods above the gang minimum, one at a time, wherever they fit, for jobs
whose minimum is placed; in the same queue-fair order as allocate."""

from __future__ import annotations

from arranger.sched.framework import action
from arranger.sched.placement import explain, groups, ordered, place_group
from arranger.sched.session import Session
from arranger.sched.statement import Statement


@action("backfill")
def backfill(session: Session) -> None:
    for job in sorted(
        session.pending_jobs,
        key=lambda j: (session.queue_key(session.queue_of(j)), session.job_key(j)),
    ):
        progress = session.progress[job.id]
        if not progress.minimum_placed:
            continue
        extras = ordered(session.extras(job))
        statement = Statement(session)
        left, why = 0, ""
        for group in groups(extras):
            fits = len(group)
            for count in range(1, len(group) + 1):  # the queue's capability may stop the group
                blocked = session.admit(job, group[0].request.scaled(count))
                if blocked:
                    fits, why = count - 1, why or blocked
                    break
            placed = place_group(session, statement, job, group[:fits])
            if placed < len(group):
                if not why:
                    why = explain(session, session.nodes, group[placed], job, minimum=False)
                left += len(group) - placed
        statement.commit(session.plan)
        progress.extras_left, progress.extras_why = left, why
