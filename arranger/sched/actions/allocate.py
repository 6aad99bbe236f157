"""allocate places each admitted job's gang minimum, all of it or none of it.

Queues take turns: the queue with the smallest share (allocated/deserved, from the plugins'
queue keys) offers its next job in job order; after the attempt it takes its turn again with
its new share. A job that does not fit is left for this cycle, with the reason. A job whose
minimum is still stopping (it was evicted whole) waits for all of it to be gone, so its gang
is placed together again.

A job for which earlier evictions are freeing room (a claimant: see Claim) goes before the
queues' turns: the room was made for it; if its minimum does not fit yet, the room its
victims still stopping will free is held for it until the cycle ends, so that what is
already free is not handed to another job meanwhile. Claimants whose victims are all gone go
first, so that one still waiting for its victims does not take the room freed for another.
The queues' turns then start from their shares with the claimants placed.

A job its queue's capability keeps out, but that would fit it once the queue's stopping pods
are gone, holds that much of the capability until allocate ends: a lower-priority job of the
queue does not take the room being made for it (preempt then claims it on the nodes).
"""

from __future__ import annotations

import heapq
from collections import deque

from arranger.sched.actions.preempt import hold_claimed_room
from arranger.sched.framework import action
from arranger.sched.placement import place_all_or_nothing
from arranger.sched.resources import Res
from arranger.sched.session import Session
from arranger.sched.snapshot import JobInfo


@action("allocate")
def allocate(session: Session) -> None:
    waiting: dict[str, deque[JobInfo]] = {}
    claimants: list[JobInfo] = []  # room is being freed for them: they go first
    for job in sorted(session.pending_jobs, key=session.job_key):
        progress = session.progress[job.id]
        if not progress.admitted:
            continue
        if not session.minimum(job):
            progress.minimum_placed = True
            continue
        if job.id in session.claimants:
            claimants.append(job)
            continue
        waiting.setdefault(session.queue_of(job).info.name, deque()).append(job)
    stopping: dict[str, Res] = {}  # per queue, what its stopping pods hold
    for victim, pod in session.terminating:
        name = session.queue_of(victim).info.name
        stopping[name] = stopping.get(name, Res()) + pod.request
    held: dict[str, Res] = {}
    # Claimants whose victims are all gone first: their room is free now, and a claimant
    # still waiting for its own victims must not be placed in it (it holds its own room).
    still = {(victim.id, pod.name) for victim, pod in session.terminating}
    waiting_for = {
        claim.job_id for claim in session.snapshot.claims if any(v in still for v in claim.victims)
    }
    claimants.sort(key=lambda job: job.id in waiting_for)  # stable: job order within each
    for job in claimants:
        _place_minimum(session, job, stopping, held)
    # The queues' turns start from their shares with the claimants placed: a queue whose
    # claimant took the room freed for it has had its turn.
    heap = [(session.queue_key(session.queues[name]), name) for name in waiting]
    heapq.heapify(heap)
    while heap:
        _, name = heapq.heappop(heap)
        jobs = waiting[name]
        job = jobs.popleft()
        _place_minimum(session, job, stopping, held)
        if jobs:
            heapq.heappush(heap, (session.queue_key(session.queues[name]), name))
    for name, amount in held.items():
        session.queues[name].allocated = session.queues[name].allocated - amount


def _place_minimum(
    session: Session, job: JobInfo, stopping: dict[str, Res], held: dict[str, Res]
) -> None:
    progress = session.progress[job.id]
    minimum = session.minimum(job)
    own = sum(1 for p in job.running if p.terminating and p.in_minimum)
    if own:  # evicted whole: its gang starts again only once all of it has stopped
        progress.why = f"waiting for {own} of its pods to stop"
        return
    request = Res.total(minimum)
    why = session.admit(job, request)
    if why:
        progress.why = why
        queue = session.queue_of(job)
        name = queue.info.name
        if name in stopping and not session.admit(job, request - stopping[name]):
            queue.allocated = queue.allocated + request  # held: see the module's docstring
            held[name] = held.get(name, Res()) + request
        return
    statement, misfit = place_all_or_nothing(session, job, minimum)
    if misfit is not None:
        progress.why = misfit.message(minimum)
        if job.id in session.claimants:  # the room on its way stays its own
            hold_claimed_room(session, job, minimum)
        return
    statement.commit(session.plan)
    progress.minimum_placed = True
