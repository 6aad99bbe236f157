"""backfill places pods above the gang minimum, one at a time, wherever they fit, for jobs
whose minimum is placed, in the queue-fair order of allocate, with shares that move.

Jobs take turns as Volcano's allocate gives them: the queue with the smallest share offers its
job first in order (the job keys: priority, DRF's dominant share, submit time), which places
pods until another queue or another job of its queue comes first, which then takes its turn. Shares are read as they stand after each pod, so jobs
asking DRF share spare room as their dominant shares grow, and queues as theirs grow; the first
job no longer takes all of it. A job whose pods fit nowhere, or whose queue's capability stops
them, leaves the turns with the count left and why.

Placing is incremental (placement.GroupPlacer): a job's group keeps its scores from turn to
turn, and only the nodes placed on since its last turn are scored again.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from arranger.sched.framework import action
from arranger.sched.placement import GroupPlacer, explain, groups, ordered
from arranger.sched.session import Session
from arranger.sched.snapshot import JobInfo, PodRequest
from arranger.sched.statement import Statement


class _Extras:
    """_Extras: one job's pods above its minimum, placed a pod per call, group after group."""

    def __init__(self, session: Session, job: JobInfo, changed: list[int]) -> None:
        self.session, self.job, self.changed = session, job, changed
        self.statement = Statement(session)
        self.left, self.why = 0, ""
        self._pods: Iterator[tuple[PodRequest, list[PodRequest], int]] = (
            (pod, group, i)
            for group in groups(ordered(session.extras(job)))
            for i, pod in enumerate(group)
        )
        self._placer: GroupPlacer | None = None
        self._group: list[PodRequest] | None = None
        self._skip: list[PodRequest] | None = None  # a group given up on

    def place_one(self) -> bool:
        """place_one places the next pod; False when none is left to place."""
        session, job = self.session, self.job
        for pod, group, i in self._pods:
            if group is self._skip:
                continue
            if group is not self._group:
                self._group = group
                self._placer = GroupPlacer(session, self.statement, job, pod, None, self.changed)
            blocked = session.admit(job, pod.request)
            if not blocked:
                assert self._placer is not None
                if self._placer.place([pod]):
                    return True
                blocked = explain(session, session.nodes, pod, job, minimum=False)
            self.why = self.why or blocked
            self.left += len(group) - i
            self._skip = group
        return False

    def finish(self) -> None:
        self.statement.commit(self.session.plan)
        progress = self.session.progress[self.job.id]
        progress.extras_left, progress.extras_why = self.left, self.why


@action("backfill")
def backfill(session: Session) -> None:
    changed: list[int] = []  # nodes placed on, in order: each job's placer catches up on them
    jobs: dict[str, list[tuple[tuple[float | str, ...], int, _Extras]]] = {}
    for n, job in enumerate(session.pending_jobs):
        if session.progress[job.id].minimum_placed:
            heap = jobs.setdefault(session.queue_of(job).info.name, [])
            heap.append((session.job_key(job), n, _Extras(session, job, changed)))
    queues = [(session.queue_key(session.queues[name]), name) for name in jobs]
    for heap in jobs.values():
        heapq.heapify(heap)
    heapq.heapify(queues)
    # A pod changes only its own job's key and its own queue's: every other key in the heaps
    # stays exact, so the job and the queue at the top are the ones that come first.
    while queues:
        _, name = heapq.heappop(queues)
        queue, heap = session.queues[name], jobs[name]
        _, n, extras = heapq.heappop(heap)
        job = extras.job
        while extras.place_one():
            if queues and session.queue_key(queue) > queues[0][0]:
                heapq.heappush(heap, (session.job_key(job), n, extras))
                break
            if heap and session.job_key(job) > heap[0][0]:
                heapq.heappush(heap, (session.job_key(job), n, extras))
                break
        else:
            extras.finish()
        if heap:
            heapq.heappush(queues, (session.queue_key(queue), name))
