"""reserve guards against starvation: a job that has waited too long gets nodes locked for it.

The target is the waiting job (minimum not placed) that has waited past the starvation
threshold with the highest priority, then the longest wait; a target keeps its reservation
while it waits. Each cycle one more node is locked for it — of the nodes it could use, the
one with the most free capacity of what it asks for — until its minimum would fit on the
locked nodes once they drain. Locked nodes take no new pods of other jobs (a filter of the
predicates plugin) but nothing on them is evicted: as their pods end, the space stays for
the target, which then fits. Other jobs keep using every node that is not locked (backfill).
"""

from __future__ import annotations

import numpy as np

from arranger.sched import reasons
from arranger.sched.framework import action
from arranger.sched.placement import place_all_or_nothing
from arranger.sched.plan import Reservation
from arranger.sched.resources import Res
from arranger.sched.session import Session
from arranger.sched.snapshot import JobInfo


@action("reserve")
def reserve(session: Session) -> None:
    target = _target(session)
    if target is None:
        session.plan.reservation = None
        return
    previous = session.snapshot.reservation
    nodes = session.nodes
    locked = np.zeros(len(nodes), dtype=np.bool_)
    if previous is not None and previous.job_id == target.id:
        for name in previous.nodes:
            if name in nodes.index and nodes.schedulable[nodes.index[name]]:
                locked[nodes.index[name]] = True
    minimum = session.minimum(target)
    if not _fits_drained(session, target, locked):
        usable = np.ones(len(nodes), dtype=np.bool_)
        for pod in minimum:
            usable &= session.static_mask(pod, target)
        candidates = usable & ~locked
        if candidates.any():
            free = np.where(candidates, _free_share(session, target), -1.0)
            locked[int(np.argmax(free))] = True  # ties: the first by name
    names = tuple(nodes.names[i] for i in np.flatnonzero(locked))
    session.plan.reservation = Reservation(target.id, names)
    progress = session.progress[target.id]
    progress.code = reasons.RESERVING
    progress.why = f"{len(names)} nodes reserved for it ({', '.join(names[:5])}{'...' * (len(names) > 5)}); {progress.why}"


def _target(session: Session) -> JobInfo | None:
    threshold, now = session.config.starvation_threshold_s, session.now
    waiting = [
        job
        for job in session.jobs
        if session.minimum(job)
        and not session.progress[job.id].minimum_placed
        and not session.progress[job.id].never
        and job.waiting_since is not None
        and now - job.waiting_since >= threshold
    ]
    if not waiting:
        return None
    previous = session.snapshot.reservation
    for job in waiting:
        if previous is not None and job.id == previous.job_id:
            return job
    return min(waiting, key=lambda j: (-j.priority, j.waiting_since or 0.0, j.id))


def _fits_drained(session: Session, job: JobInfo, locked: np.ndarray) -> bool:
    """_fits_drained: would the minimum fit on the locked nodes once they are empty?"""
    if not locked.any():
        return False
    statement, misfit = place_all_or_nothing(
        session, job, session.minimum(job), session.empty_nodes(), only=locked
    )
    statement.discard()
    return misfit is None


def _free_share(session: Session, job: JobInfo) -> np.ndarray:
    """_free_share: per node, the mean free fraction of the resources the job asks for."""
    nodes = session.nodes
    request = Res.total(session.minimum(job))
    parts = []
    if request.cpu_milli:
        parts.append((nodes.alloc_cpu - nodes.used_cpu) / nodes.div_cpu)
    if request.memory_bytes:
        parts.append((nodes.alloc_mem - nodes.used_mem) / nodes.div_mem)
    if request.gpu_milli:
        parts.append((nodes.alloc_gpu - nodes.used_gpu) / nodes.div_gpu)
    if not parts:
        return np.zeros(len(nodes), dtype=np.float64)
    result: np.ndarray = sum(parts) / len(parts)  # type: ignore[assignment]
    return result
