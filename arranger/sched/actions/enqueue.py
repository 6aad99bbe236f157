"""enqueue admits a job into the cycle only if its queue may take its minimum and the cluster
could hold it at all: each pod shape of the minimum fits some schedulable node when empty, and
the minimum's total fits what the schedulable nodes have in all. Cheap checks, no placement."""

from __future__ import annotations

from arranger.sched.framework import action
from arranger.sched.nodes import BoolArray, NodeArrays
from arranger.sched.placement import explain, groups, ordered
from arranger.sched.resources import Res
from arranger.sched.session import Session
from arranger.sched.snapshot import JobInfo, PodRequest


@action("enqueue")
def enqueue(session: Session) -> None:
    for job in session.jobs:
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
        why = session.admit(job, request)
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
