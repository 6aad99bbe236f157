"""enqueue admits a job into the cycle only if its queue is not over its capability and the
cluster could hold its minimum at all: the minimum fits the queue's capability on its own,
each pod shape of it fits some schedulable node when empty, and its total fits what the
schedulable nodes have in all. Cheap checks, no placement.

A job is admitted even when its minimum would take its queue over its capability as things
stand: allocate will not place it then, but preempt may evict lower-priority work of its own
queue until it fits (the capability is checked again once the victims are released)."""

from __future__ import annotations

from arranger.sched.framework import action
from arranger.sched.nodes import BoolArray, NodeArrays
from arranger.sched.placement import explain, groups, ordered
from arranger.sched.resources import Res
from arranger.sched.session import Session
from arranger.sched.snapshot import JobInfo, PodRequest


@action("enqueue")
def enqueue(session: Session) -> None:
    for job in session.pending_jobs:
        progress = session.progress[job.id]
        minimum = session.minimum(job)
        if not minimum:
            progress.admitted = True
            continue
        request = Res.total(minimum)
        never = _never(session, job, minimum, request)
        if never:
            progress.why, progress.never = never, True
            continue
        why = session.admit(job, Res())  # the queue is not over its capability already
        if why:
            progress.why = why
            continue
        progress.admitted = True


def _never(session: Session, job: JobInfo, minimum: list[PodRequest], request: Res) -> str:
    queue = session.queue_of(job)
    over = request.exceeded(queue.info.capability)
    if over:
        return f"it needs more {', '.join(over)} than queue {queue.info.name}'s capability"
    empty = session.empty_nodes()
    over = request.exceeded(empty.total())
    if over:
        count = int(empty.schedulable.sum())
        return f"it needs more {', '.join(over)} than the whole cluster has ({count} ready node{'s' * (count != 1)})"
    for group in groups(ordered(minimum)):
        pod = group[0]
        if not (session.static_mask(pod, job, empty) & _fits_empty(empty, pod)).any():
            return explain(session, empty, pod, job, minimum=True)
    return ""


def _fits_empty(empty: NodeArrays, pod: PodRequest) -> BoolArray:
    """_fits_empty: the nodes that could hold the pod if they held nothing else."""
    return empty.fits(pod, slice(None))
