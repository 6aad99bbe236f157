"""statement records tentative placements so a gang is committed or discarded as one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from arranger.sched.nodes import Allocation, NodeArrays
from arranger.sched.plan import GpuShare, Placement, Plan
from arranger.sched.snapshot import JobInfo, PodRequest

if TYPE_CHECKING:
    from arranger.sched.session import Session


class Statement:
    """Statement applies placements to the node arrays at once, tells the plugins (queue and
    job bookkeeping), and remembers how to undo both.

    commit() appends the placements to the plan; discard() gives back exactly what was taken.
    Either leaves the statement empty and reusable. With `nodes` other than the session's
    (a what-if on the empty cluster) the plugins are not told.
    """

    def __init__(self, session: Session, nodes: NodeArrays | None = None) -> None:
        self.session = session
        self.nodes = nodes or session.nodes
        self._tell = self.nodes is session.nodes
        self._steps: list[tuple[JobInfo, PodRequest, Allocation]] = []

    def __len__(self) -> int:
        return len(self._steps)

    def allocate(
        self, job: JobInfo, pod: PodRequest, node: int, gpus: tuple[GpuShare, ...]
    ) -> None:
        alloc = Allocation(node, pod.cpu_milli, pod.memory_bytes, gpus)
        self.nodes.apply(alloc)
        if self._tell:
            for hook in self.session.on_allocate:
                hook(job, pod, node, 1)
        self._steps.append((job, pod, alloc))

    def discard(self) -> None:
        for job, pod, alloc in reversed(self._steps):
            self.nodes.apply(alloc, sign=-1)
            if self._tell:
                for hook in self.session.on_allocate:
                    hook(job, pod, alloc.node, -1)
        self._steps.clear()

    def commit(self, plan: Plan) -> None:
        names = self.nodes.names
        plan.placements.extend(
            Placement(job.id, pod.name, names[alloc.node], alloc.gpus)
            for job, pod, alloc in self._steps
        )
        self._steps.clear()
