"""room: whether a waiting job's gang minimum fits the cluster as victims are released and
restored, counted without placing where the count is exact (Room), and the minimum placed on
trial (claim_room). Used by the victim search (victims) and preempt's claims."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import numpy as np

from arranger.sched.placement import first_places, groups, ordered, place_all_or_nothing
from arranger.sched.resources import Res
from arranger.sched.session import Session
from arranger.sched.snapshot import GPU_MILLI, JobInfo, PodRequest
from arranger.sched.statement import Statement


def claim_room(
    session: Session, job: JobInfo, minimum: list[PodRequest], checked: bool = False
) -> Statement | None:
    """claim_room places the minimum tentatively and returns the statement holding it, or
    None when it does not fit (or its queue may not take it). `checked`: the caller already
    knows each shape has room on its own, or expects the minimum to fit."""
    if session.admit(job, Res.total(minimum)):
        return None
    if not checked and not Room(session, job, minimum).enough():
        return None
    statement, misfit = place_all_or_nothing(session, job, minimum, explained=False)
    return statement if misfit is None else None


class Room:
    """Room answers quickly whether the minimum fits, by counting: for each pod shape, the
    usable nodes have room for that many pods of it, each node counted on its own; the nodes
    some pod may use have, all together, the CPU and the whole GPUs the minimum asks for; and
    (fits) a leader and its workers fit together, each node counted with the leader on it or
    not. Releases and restores within `changing(nodes)` update the counts in O(shapes) a node.

    `exact`: for a minimum of one shape, or of one pod and one set of identical pods, in CPU,
    memory and whole GPUs (and no model asked of a cluster with nodes of mixed models), the
    count is exact and place_all_or_nothing places the minimum whenever `fits()` says so; for
    any other minimum `fits()` is only necessary and a trial placement decides."""

    def __init__(self, session: Session, job: JobInfo, minimum: list[PodRequest]) -> None:
        self.session, self.job = session, job
        self.nodes = nodes = session.nodes
        self.shapes = [(group[0], len(group)) for group in groups(ordered(minimum))]
        self.masks = [session.static_mask(pod, job) for pod, _ in self.shapes]
        self.room = [nodes.room_for(pod, count, slice(None)) for pod, count in self.shapes]
        self.totals = [int(r[m].sum()) for r, m in zip(self.room, self.masks, strict=True)]
        self.usable = np.logical_or.reduce(self.masks)
        self.cpu_wanted = sum(p.cpu_milli * n for p, n in self.shapes)
        self.gpus_wanted = sum(
            (p.gpu_milli // GPU_MILLI) * n for p, n in self.shapes if p.gpu_milli >= GPU_MILLI
        )
        free_cpu = np.maximum(0, nodes.alloc_cpu - nodes.used_cpu)
        self.cpu = int(free_cpu[self.usable].sum())
        self.gpus = int(nodes.free_whole[self.usable].sum())
        self.exact = (
            (len(self.shapes) == 1 or (len(self.shapes) == 2 and self.shapes[0][1] == 1))
            and all(p.gpu_milli % GPU_MILLI == 0 for p, _ in self.shapes)
            and not (
                any(p.gpu_models and p.gpu_milli for p, _ in self.shapes) and session.mixed_models()
            )
        )

    def _free(self, node: int) -> tuple[int, int]:
        nodes = self.nodes
        return max(0, int(nodes.alloc_cpu[node] - nodes.used_cpu[node])), int(
            nodes.free_whole[node]
        )

    @contextmanager
    def changing(self, nodes: Iterable[int]) -> Iterator[None]:
        """changing: the nodes change within (pods released or restored); the counts follow."""
        nodes = list(nodes)
        for node in nodes:
            if self.usable[node]:
                cpu, gpus = self._free(node)
                self.cpu -= cpu
                self.gpus -= gpus
        yield
        for node in nodes:
            self._changed(node)

    def _changed(self, node: int) -> None:
        if self.usable[node]:
            cpu, gpus = self._free(node)
            self.cpu += cpu
            self.gpus += gpus
        for i, (pod, count) in enumerate(self.shapes):
            if self.masks[i][node]:
                new = int(self.nodes.room_for(pod, count, node))
                self.totals[i] += new - int(self.room[i][node])
                self.room[i][node] = new

    def enough(self) -> bool:
        """enough: each shape has room on its own, and the CPU and whole GPUs together."""
        return (
            self.cpu >= self.cpu_wanted
            and self.gpus >= self.gpus_wanted
            and all(
                total >= count for total, (_, count) in zip(self.totals, self.shapes, strict=True)
            )
        )

    def fits(self) -> bool:
        """fits: enough(), and, for one pod and a set, room for both together (dearer)."""
        if not self.enough():
            return False
        if len(self.shapes) == 2 and self.shapes[0][1] == 1:
            (first, _), (rest, count) = self.shapes
            workers = np.where(self.masks[1], self.room[1], 0)
            places = first_places(
                self.session, self.nodes, self.job, first, rest, count, rest_room=workers
            )
            return len(places) > 0
        return True
