"""timers: when the clock alone changes a job, kept from the changes the controller makes.

A job has a timer when one of its pods waits out a restart back-off or it may run past its
maxRuntimeSeconds (see `Controller.timer`). The timers sit in a heap refreshed only for the
jobs a change touched, so the scheduling loop's wake time and the clock's stimuli cost what
changed, not what the cluster holds.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable


class Timers:
    """Timers: each job's earliest time the clock changes it (`timer_of(job_id)`, None: none).

    `changed(ids)` is told every job a change touched; `due(now)` hands over the jobs whose
    time has come; `next()` is the earliest time still to come. A job handed over that the
    clock's stimulus could not settle (its time is still past) is handed over again `retry_s`
    later, not at once, so a stuck back-off never spins the loop."""

    def __init__(self, timer_of: Callable[[str], float | None], retry_s: float) -> None:
        self.timer_of = timer_of
        self.retry_s = retry_s
        self._heap: list[tuple[float, str]] = []  # (time, job id); stale entries are skipped
        self._at: dict[str, float] = {}  # job id -> its current entry's time
        self._dirty: set[str] = set()

    def changed(self, job_ids: Iterable[str]) -> None:
        """changed: these jobs' timers may differ from what is kept."""
        self._dirty.update(job_ids)

    def due(self, now: float) -> list[str]:
        """due: the jobs whose time has come (each once), in time order."""
        self._refresh(now)
        out: list[str] = []
        while self._heap and self._heap[0][0] <= now:
            at, job_id = heapq.heappop(self._heap)
            if self._at.get(job_id) == at:
                del self._at[job_id]
                out.append(job_id)
        self._dirty.update(out)  # what the stimulus made of them is looked at next time
        return out

    def next(self, now: float) -> float | None:
        """next: the earliest time a job's timer comes, if any."""
        self._refresh(now)
        heap = self._heap
        while heap and self._at.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def at(self, job_id: str, now: float) -> float | None:
        """at: when the job is next handed over, if it is waiting for that."""
        self._refresh(now)
        return self._at.get(job_id)

    def _refresh(self, now: float) -> None:
        for job_id in self._dirty:
            at = self.timer_of(job_id)
            if at is None:
                self._at.pop(job_id, None)
                continue
            known = self._at.get(job_id)
            if at <= now:  # past: the job is retried, or already waits for its retry
                if known is not None and known > now:
                    continue
                at = now + self.retry_s
            if known != at:
                self._at[job_id] = at
                heapq.heappush(self._heap, (at, job_id))
        self._dirty.clear()
