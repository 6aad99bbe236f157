"""reserve guards against starvation: a job that has waited too long gets nodes locked for it.

The target is the admitted job whose minimum is not placed, that has waited past the
starvation threshold, with the highest priority, then the longest wait; a target keeps its
reservation while it waits. Each cycle one more node is locked for it until its minimum would
fit on the locked nodes once they drain: a node where the first pod that does not fit yet
would fit on its own, the one with the most free capacity of what that pod asks for first.
Locked nodes take no new pods of other jobs (a filter of the predicates plugin) but nothing on
them is evicted: as their pods end, the room stays for the target, which then fits. Other
jobs keep using every node that is not locked (backfill). A job that would not fit even on
every schedulable node drained gets no reservation: locking would only starve the others.
Nor does a job held back by its queue's capability: locked nodes make no room in a
capability (preempt does, by evicting lower-priority work of the job's own queue).
"""

from __future__ import annotations

import numpy as np

from arranger.sched import reasons
from arranger.sched.framework import action
from arranger.sched.nodes import BoolArray, FloatArray
from arranger.sched.placement import Misfit, ordered, place_all_or_nothing
from arranger.sched.plan import Reservation
from arranger.sched.resources import Res
from arranger.sched.session import Session
from arranger.sched.snapshot import JobInfo, PodRequest


@action("reserve")
def reserve(session: Session) -> None:
    session.plan.reservation = None
    target = _target(session)
    if target is None:
        return
    nodes = session.nodes
    locked: BoolArray = np.zeros(len(nodes), dtype=np.bool_)
    previous = session.snapshot.reservation
    if previous is not None and previous.job_id == target.id:
        for name in previous.nodes:
            if name in nodes.index and nodes.schedulable[nodes.index[name]]:
                locked[nodes.index[name]] = True
    if _drained_misfit(session, target, nodes.schedulable) is not None:
        return  # even every schedulable node, drained, would not do
    misfit = _drained_misfit(session, target, locked)
    if misfit is not None:
        pod = ordered(session.minimum(target))[misfit.position]
        empty = session.empty_nodes()
        candidates = (
            session.static_mask(pod, target, empty)
            & empty.fits(pod, slice(None))
            & nodes.schedulable
            & ~locked
        )
        if candidates.any():
            free = np.where(candidates, _free_share(session, pod), -1.0)
            locked[int(np.argmax(free))] = True  # ties: the first by name
    names = tuple(nodes.names[i] for i in np.flatnonzero(locked))
    session.plan.reservation = Reservation(target.id, names)
    progress = session.progress[target.id]
    progress.code = reasons.RESERVING
    shown = ", ".join(names[:5]) + ("..." if len(names) > 5 else "")
    progress.why = f"{len(names)} nodes reserved for it ({shown}); {progress.why}"


def _target(session: Session) -> JobInfo | None:
    threshold, now = session.config.starvation_threshold_s, session.now
    waiting = [
        job
        for job in session.pending_jobs
        if session.minimum(job)
        and session.progress[job.id].admitted
        and not session.progress[job.id].minimum_placed
        and job.waiting_since is not None
        and now - job.waiting_since >= threshold
        and not session.admit(job, Res.total(session.minimum(job)))
    ]
    if not waiting:
        return None
    previous = session.snapshot.reservation
    for job in waiting:
        if previous is not None and job.id == previous.job_id:
            return job
    return min(waiting, key=lambda j: (-j.priority, j.waiting_since or 0.0, j.id))


def _drained_misfit(session: Session, job: JobInfo, only: BoolArray) -> Misfit | None:
    """_drained_misfit: would the minimum fit on these nodes once they are empty? None if so,
    else which pod would not."""
    if not only.any():
        return Misfit(0, 0, ())
    statement, misfit = place_all_or_nothing(
        session, job, session.minimum(job), session.empty_nodes(), only=only, explained=False
    )
    statement.discard()
    return misfit


def _free_share(session: Session, pod: PodRequest) -> FloatArray:
    """_free_share: per node, the mean free fraction of the resources the pod asks for."""
    nodes = session.nodes
    parts: list[FloatArray] = []
    if pod.cpu_milli:
        parts.append((nodes.alloc_cpu - nodes.used_cpu) / nodes.div_cpu)
    if pod.memory_bytes:
        parts.append((nodes.alloc_mem - nodes.used_mem) / nodes.div_mem)
    if pod.gpu_milli:
        parts.append((nodes.alloc_gpu - nodes.used_gpu) / nodes.div_gpu)
    if not parts:
        return np.zeros(len(nodes), dtype=np.float64)
    total: FloatArray = sum(parts[1:], parts[0])
    return total / len(parts)
