"""allocate places each admitted job's gang minimum, all of it or none of it.

Queues take turns: the queue with the smallest share (allocated/deserved, from the plugins'
queue keys) offers its next job in job order; after the attempt it takes its turn again with
its new share. A job that does not fit is left for this cycle, with the reason. A job whose
minimum is still stopping (it was evicted whole) waits for all of it to be gone, so its gang
is placed together again.
"""

from __future__ import annotations

import heapq
from collections import deque

from arranger.sched.framework import action
from arranger.sched.placement import place_all_or_nothing
from arranger.sched.resources import Res
from arranger.sched.session import Session
from arranger.sched.snapshot import JobInfo


@action("allocate")
def allocate(session: Session) -> None:
    waiting: dict[str, deque[JobInfo]] = {}
    for job in sorted(session.jobs, key=session.job_key):
        progress = session.progress[job.id]
        if not progress.admitted:
            continue
        if not session.minimum(job):
            progress.minimum_placed = True
            continue
        waiting.setdefault(session.queue_of(job).info.name, deque()).append(job)
    heap = [(session.queue_key(session.queues[name]), name) for name in waiting]
    heapq.heapify(heap)
    while heap:
        _, name = heapq.heappop(heap)
        jobs = waiting[name]
        job = jobs.popleft()
        _place_minimum(session, job)
        if jobs:
            heapq.heappush(heap, (session.queue_key(session.queues[name]), name))


def _place_minimum(session: Session, job: JobInfo) -> None:
    progress = session.progress[job.id]
    minimum = session.minimum(job)
    stopping = sum(1 for p in job.running if p.terminating and p.in_minimum)
    if stopping:  # evicted whole: its gang starts again only once all of it has stopped
        progress.why = f"waiting for {stopping} of its pods to stop"
        return
    why = session.admit(job, Res.total(minimum))
    if why:
        progress.why = why
        return
    statement, misfit = place_all_or_nothing(session, job, minimum)
    if misfit is not None:
        progress.why = misfit.message(minimum)
        return
    statement.commit(session.plan)
    progress.minimum_placed = True
