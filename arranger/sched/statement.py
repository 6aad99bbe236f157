"""statement records tentative placements so a gang is committed or discarded as one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from arranger.sched.nodes import Allocation, NodeArrays
from arranger.sched.plan import GpuShare, Placement, Plan
from arranger.sched.resources import Res
from arranger.sched.snapshot import JobInfo, PodRequest, RunningPod

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
        self.nodes = nodes if nodes is not None else session.nodes
        self._tell = self.nodes is session.nodes
        self._steps: list[tuple[JobInfo, str, Res, Allocation, int]] = []

    def __len__(self) -> int:
        return len(self._steps)

    def allocate(
        self, job: JobInfo, pod: PodRequest, node: int, gpus: tuple[GpuShare, ...]
    ) -> None:
        alloc = Allocation(node, pod.cpu_milli, pod.memory_bytes, gpus)
        self._apply(job, pod.name, pod.request, alloc, 1)

    def release(self, job: JobInfo, pod: RunningPod) -> None:
        """release takes a running pod's resources back, as if it were gone (a what-if for
        eviction; discard gives them back)."""
        node = self.nodes.index[pod.node]
        alloc = Allocation(node, pod.request.cpu_milli, pod.request.memory_bytes, pod.gpus)
        self._apply(job, pod.name, pod.request, alloc, -1)

    def restore(self, job: JobInfo, pod: RunningPod) -> None:
        """restore puts a released running pod back (a what-if within the release's: sparing a
        victim; discard takes it away again)."""
        node = self.nodes.index[pod.node]
        alloc = Allocation(node, pod.request.cpu_milli, pod.request.memory_bytes, pod.gpus)
        self._apply(job, pod.name, pod.request, alloc, 1)

    def _apply(self, job: JobInfo, name: str, request: Res, alloc: Allocation, sign: int) -> None:
        self.nodes.apply(alloc, sign)
        if self._tell:
            for hook in self.session.on_allocate:
                hook(job, request, alloc.node, sign)
        self._steps.append((job, name, request, alloc, sign))

    def nodes_used(self) -> set[int]:
        """nodes_used: the nodes this statement placed pods on."""
        return {alloc.node for _, _, _, alloc, sign in self._steps if sign > 0}

    def discard(self) -> None:
        for job, _, request, alloc, sign in reversed(self._steps):
            self.nodes.apply(alloc, -sign)
            if self._tell:
                for hook in self.session.on_allocate:
                    hook(job, request, alloc.node, -sign)
        self._steps.clear()

    def commit(self, plan: Plan) -> None:
        """commit appends the placements to the plan (releases are only ever what-ifs)."""
        names = self.nodes.names
        plan.placements.extend(
            Placement(job.id, name, names[alloc.node], alloc.gpus)
            for job, name, _, alloc, sign in self._steps
            if sign > 0
        )
        self._steps.clear()
