"""nodes holds one cycle's mutable view of node capacity, as numpy arrays indexed by node.

Nodes are sorted by name, so "the first best node" is the tie-break by name. Placements update
the arrays in place; a statement undoes them exactly. A caller that keeps the arrays between
cycles (the server) updates only the nodes that changed and hands each cycle a copy (see
node_columns).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from arranger.sched.node_columns import NodeColumns
from arranger.sched.plan import GpuShare
from arranger.sched.resources import Res
from arranger.sched.snapshot import GPU_MILLI, PodRequest

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
Index = slice | IntArray | int  # an int gives numpy scalars: fast for rescoring one node


@dataclass(frozen=True, slots=True)
class Allocation:
    """Allocation is one pod tentatively on one node, enough to undo it exactly."""

    node: int
    cpu_milli: int
    memory_bytes: int
    gpus: tuple[GpuShare, ...]


class NodeArrays(NodeColumns):
    """NodeArrays is the cluster as the placements so far in this cycle have left it: which
    nodes a pod fits (`fits`, `room_for`), the GPUs it gets there (`assign_gpus`), placements
    made and undone (`apply`) and the utilisation they leave (`util_after`). An unhealthy
    GPU stays wholly taken whatever is undone."""

    def total(self) -> Res:
        """total is what the schedulable nodes have in all."""
        mask = self.schedulable
        return Res(
            int(self.alloc_cpu[mask].sum()),
            int(self.alloc_mem[mask].sum()),
            int(self.alloc_gpu[mask].sum()),
        )

    # Resource fit, per requirement, so reasons can name the one that fails.

    def cpu_fits(self, pod: PodRequest, at: Index) -> BoolArray:
        result: BoolArray = self.alloc_cpu[at] - self.used_cpu[at] >= pod.cpu_milli
        return result

    def memory_fits(self, pod: PodRequest, at: Index) -> BoolArray:
        result: BoolArray = self.alloc_mem[at] - self.used_mem[at] >= pod.memory_bytes
        return result

    def gpu_fits(self, pod: PodRequest, at: Index) -> BoolArray:
        if pod.gpu_milli >= GPU_MILLI:
            whole: BoolArray = self.free_whole[at] >= pod.gpu_milli // GPU_MILLI
            return whole
        share: BoolArray = self.best_share[at] >= pod.gpu_milli
        return share

    def fits(self, pod: PodRequest, at: Index) -> BoolArray:
        """fits: the nodes at `at` with the pod's CPU, memory and GPUs free."""
        mask = self.cpu_fits(pod, at) & self.memory_fits(pod, at)
        if pod.gpu_milli:
            mask &= self.gpu_fits(pod, at)
        return mask

    def room_for(
        self, pod: PodRequest, count: int, at: Index, taken: PodRequest | None = None
    ) -> IntArray:
        """room_for: how many pods like `pod` (at most `count`) each node at `at` takes, with
        `taken` placed there first when given. Exact for CPU, memory and whole GPUs (on a node
        whose GPUs the pod may all use); for a share of a GPU it counts the node's free share in
        total, and a share `taken` takes no whole GPU: never fewer than fit."""
        cpu, mem, gpu, whole = 0, 0, 0, 0
        if taken is not None:
            cpu, mem, gpu = taken.cpu_milli, taken.memory_bytes, taken.gpu_milli
            whole = gpu // GPU_MILLI
        if isinstance(at, int):  # one node, in Python ints: the per-node update's inner loop
            return self._room_at(pod, count, at, cpu, mem, gpu, whole)  # type: ignore[return-value]
        free_cpu = self.alloc_cpu[at] - self.used_cpu[at] - cpu
        room = np.minimum(count, np.maximum(0, free_cpu // max(pod.cpu_milli, 1)))
        if pod.memory_bytes:
            free_mem = self.alloc_mem[at] - self.used_mem[at] - mem
            room = np.minimum(room, np.maximum(0, free_mem // pod.memory_bytes))
        if pod.gpu_milli >= GPU_MILLI:
            free_whole = self.free_whole[at] - whole
            room = np.minimum(room, np.maximum(0, free_whole // (pod.gpu_milli // GPU_MILLI)))
        elif pod.gpu_milli:
            free_gpu = self.alloc_gpu[at] - self.used_gpu[at] - gpu
            room = np.minimum(room, np.maximum(0, free_gpu // pod.gpu_milli))
        result: IntArray = np.asarray(room, dtype=np.int64)
        return result

    def _room_at(
        self, pod: PodRequest, count: int, node: int, cpu: int, mem: int, gpu: int, whole: int
    ) -> int:
        room = min(
            count,
            max(
                0,
                (int(self.alloc_cpu[node]) - int(self.used_cpu[node]) - cpu)
                // max(pod.cpu_milli, 1),
            ),
        )
        if pod.memory_bytes:
            free_mem = int(self.alloc_mem[node]) - int(self.used_mem[node]) - mem
            room = min(room, max(0, free_mem // pod.memory_bytes))
        if pod.gpu_milli >= GPU_MILLI:
            free_whole = int(self.free_whole[node]) - whole
            room = min(room, max(0, free_whole // (pod.gpu_milli // GPU_MILLI)))
        elif pod.gpu_milli:
            free_gpu = int(self.alloc_gpu[node]) - int(self.used_gpu[node]) - gpu
            room = min(room, max(0, free_gpu // pod.gpu_milli))
        return room

    def fits_one(self, pod: PodRequest, node: int) -> bool:
        """fits_one: fits() for one node, in Python ints (the placement loop's re-check,
        where numpy's per-call cost would dominate)."""
        if int(self.alloc_cpu[node]) - int(self.used_cpu[node]) < pod.cpu_milli:
            return False
        if int(self.alloc_mem[node]) - int(self.used_mem[node]) < pod.memory_bytes:
            return False
        if not pod.gpu_milli:
            return True
        if pod.gpu_milli >= GPU_MILLI:
            return int(self.free_whole[node]) >= pod.gpu_milli // GPU_MILLI
        return int(self.best_share[node]) >= pod.gpu_milli

    # Placement bookkeeping.

    def assign_gpus(self, node: int, pod: PodRequest) -> tuple[GpuShare, ...] | None:
        """assign_gpus picks the node's GPUs for the pod, or None if the node cannot give them.

        Whole GPUs: the lowest-numbered entirely free GPUs of the wanted model. A share: the
        GPU that is fullest yet still has room (packing shares keeps whole GPUs free).
        """
        if pod.gpu_milli == 0:
            return ()
        used = self.gpu_used[node]
        models = self.gpu_models[node]
        ids = self.gpu_ids[node]
        allowed = pod.gpu_models
        eligible = [i for i in range(len(used)) if not allowed or models[i] in allowed]
        if pod.gpu_milli >= GPU_MILLI:
            wanted = pod.gpu_milli // GPU_MILLI
            free = [i for i in eligible if used[i] == 0][:wanted]
            if len(free) < wanted:
                return None
            return tuple(GpuShare(ids[i], GPU_MILLI) for i in free)
        room = [i for i in eligible if GPU_MILLI - used[i] >= pod.gpu_milli]
        if not room:
            return None
        best = max(room, key=lambda i: (used[i], -i))
        return (GpuShare(ids[best], pod.gpu_milli),)

    def apply(self, alloc: Allocation, sign: int = 1) -> None:
        """apply adds (sign=1) or removes (sign=-1) an allocation. An unhealthy GPU stays
        wholly taken: removing the pods on it (evicting them) makes no room there."""
        n = alloc.node
        self.used_cpu[n] += sign * alloc.cpu_milli
        self.used_mem[n] += sign * alloc.memory_bytes
        if alloc.gpus:
            ids, sick = self.gpu_ids[n], self.gpu_sick[n]
            used = list(self.gpu_used[n])  # a list of its own: copies may share the old one
            for share in alloc.gpus:
                if share.index not in sick:
                    used[ids.index(share.index)] += sign * share.milli
            self.gpu_used[n] = used
            self.used_gpu[n] = sum(used)
            self.free_whole[n] = sum(1 for u in used if u == 0)
            self.best_share[n] = max((GPU_MILLI - u for u in used), default=0)

    # Utilisation after a placement, per resource.

    def util_after(self, pod: PodRequest, at: Index) -> tuple[FloatArray, FloatArray, FloatArray]:
        """util_after: (cpu, memory, gpu) utilisation of the nodes at `at` if the pod went there.
        For one node (an int) the values are Python floats: rescoring a node after each
        placement is the inner loop, where numpy's per-call cost would dominate."""
        if isinstance(at, int):
            return (
                (int(self.used_cpu[at]) + pod.cpu_milli) / float(self.div_cpu[at]),
                (int(self.used_mem[at]) + pod.memory_bytes) / float(self.div_mem[at]),
                (int(self.used_gpu[at]) + pod.gpu_milli) / float(self.div_gpu[at]),
            )  # type: ignore[return-value]
        return (
            (self.used_cpu[at] + pod.cpu_milli) / self.div_cpu[at],
            (self.used_mem[at] + pod.memory_bytes) / self.div_mem[at],
            (self.used_gpu[at] + pod.gpu_milli) / self.div_gpu[at],
        )
