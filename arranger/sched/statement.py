"""statement records tentative placements so a gang is committed or discarded as one."""

from __future__ import annotations

from arranger.sched.plan import GpuShare, Placement, Plan
from arranger.sched.session import Allocation, Session
from arranger.sched.snapshot import PodRequest


class Statement:
    """Statement applies placements to the session at once and remembers how to undo them.

    commit() appends them to the plan; discard() gives the session back exactly what it took.
    Either leaves the statement empty and reusable.
    """

    def __init__(self, session: Session) -> None:
        self.session = session
        self._steps: list[tuple[str, PodRequest, Allocation]] = []

    def __len__(self) -> int:
        return len(self._steps)

    def allocate(self, job_id: str, pod: PodRequest, node: int, gpus: tuple[GpuShare, ...]) -> None:
        alloc = Allocation(node, pod.cpu_milli, pod.memory_bytes, gpus)
        self.session.apply(alloc)
        self._steps.append((job_id, pod, alloc))

    def discard(self) -> None:
        for _, _, alloc in reversed(self._steps):
            self.session.apply(alloc, sign=-1)
        self._steps.clear()

    def commit(self, plan: Plan) -> None:
        names = self.session.names
        plan.placements.extend(
            Placement(job_id, pod.name, names[alloc.node], alloc.gpus)
            for job_id, pod, alloc in self._steps
        )
        self._steps.clear()
