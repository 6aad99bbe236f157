"""session holds one cycle's mutable view of node capacity, as numpy arrays indexed by node.

Nodes are sorted by name, so "the first best node" is the tie-break by name. Static filters
(schedulable, nodeSelector, GPU model) are computed once per distinct pod shape and reused;
resource fit is recomputed per pod from the arrays, which placements update in place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from arranger.sched import reasons
from arranger.sched.config import SchedulerConfig
from arranger.sched.plan import GpuShare
from arranger.sched.snapshot import GPU_MILLI, NodeInfo, PodRequest

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Allocation:
    """Allocation is one pod tentatively on one node, enough to undo it exactly."""

    node: int
    cpu_milli: int
    memory_bytes: int
    gpus: tuple[GpuShare, ...]


class Session:
    """Session is the cluster as placements so far in this cycle have left it.

    With `empty=True` every node starts with nothing used: that answers "could this ever fit?".
    """

    def __init__(self, nodes: tuple[NodeInfo, ...], config: SchedulerConfig, empty: bool = False):
        ordered = sorted(nodes, key=lambda n: n.name)
        self.config = config
        self.names = [n.name for n in ordered]
        self.index = {name: i for i, name in enumerate(self.names)}
        self.labels: list[Mapping[str, str]] = [n.labels for n in ordered]
        self.gpu_models: list[tuple[str, ...]] = [tuple(g.model for g in n.gpus) for n in ordered]
        self.gpu_ids: list[tuple[int, ...]] = [tuple(g.index for g in n.gpus) for n in ordered]
        self.gpu_used: list[list[int]] = [
            [0 if empty else g.used_milli for g in n.gpus] for n in ordered
        ]
        self.schedulable: BoolArray = np.array([n.schedulable for n in ordered], dtype=np.bool_)
        self.alloc_cpu: IntArray = np.array([n.cpu_milli for n in ordered], dtype=np.int64)
        self.alloc_mem: IntArray = np.array([n.memory_bytes for n in ordered], dtype=np.int64)
        self.alloc_gpu: IntArray = np.array(
            [len(n.gpus) * GPU_MILLI for n in ordered], dtype=np.int64
        )
        zeros = np.zeros(len(ordered), dtype=np.int64)
        self.used_cpu: IntArray = (
            zeros.copy() if empty else np.array([n.used_cpu_milli for n in ordered], dtype=np.int64)
        )
        self.used_mem: IntArray = (
            zeros.copy()
            if empty
            else np.array([n.used_memory_bytes for n in ordered], dtype=np.int64)
        )
        self.used_gpu: IntArray = np.array([sum(u) for u in self.gpu_used], dtype=np.int64)
        self.free_whole: IntArray = np.array(
            [sum(1 for u in used if u == 0) for used in self.gpu_used], dtype=np.int64
        )
        self.best_share: IntArray = np.array(
            [max((GPU_MILLI - u for u in used), default=0) for used in self.gpu_used],
            dtype=np.int64,
        )
        self._static: dict[tuple[object, ...], BoolArray] = {}

    def __len__(self) -> int:
        return len(self.names)

    # Filters.

    def _shape_key(self, pod: PodRequest) -> tuple[object, ...]:
        return (pod.gpu_type, tuple(sorted(pod.node_selector.items())))

    def static_mask(self, pod: PodRequest) -> BoolArray:
        """static_mask: schedulable nodes that match the pod's nodeSelector and GPU model."""
        key = self._shape_key(pod)
        mask = self._static.get(key)
        if mask is None:
            mask = self.schedulable & self._selector_mask(pod) & self._model_mask(pod)
            self._static[key] = mask
        return mask

    def _selector_mask(self, pod: PodRequest) -> BoolArray:
        if not pod.node_selector:
            return np.ones(len(self), dtype=np.bool_)
        wanted = pod.node_selector.items()
        return np.array(
            [all(labels.get(k) == v for k, v in wanted) for labels in self.labels], dtype=np.bool_
        )

    def _model_mask(self, pod: PodRequest) -> BoolArray:
        if not pod.gpu_type:
            return np.ones(len(self), dtype=np.bool_)
        return np.array([pod.gpu_type in models for models in self.gpu_models], dtype=np.bool_)

    def fit_mask(self, pod: PodRequest) -> BoolArray:
        """fit_mask: nodes that pass every filter for the pod given what is used so far."""
        mask = self.static_mask(pod)
        mask = mask & (self.alloc_cpu - self.used_cpu >= pod.cpu_milli)
        mask &= self.alloc_mem - self.used_mem >= pod.memory_bytes
        if pod.gpu_milli >= GPU_MILLI:
            mask &= self.free_whole >= pod.gpu_milli // GPU_MILLI
        elif pod.gpu_milli > 0:
            mask &= self.best_share >= pod.gpu_milli
        return mask

    def misfit_counts(self, pod: PodRequest) -> dict[str, int]:
        """misfit_counts: for each filter, the nodes it is the first to reject."""
        remaining = np.ones(len(self), dtype=np.bool_)
        counts: dict[str, int] = {}
        gpu_ok = (
            self.free_whole >= pod.gpu_milli // GPU_MILLI
            if pod.gpu_milli >= GPU_MILLI
            else self.best_share >= pod.gpu_milli
        )
        for reason, passes in (
            (reasons.NODE_UNSCHEDULABLE, self.schedulable),
            (reasons.SELECTOR_MISMATCH, self._selector_mask(pod)),
            (reasons.GPU_TYPE_MISMATCH, self._model_mask(pod)),
            (reasons.INSUFFICIENT_CPU, self.alloc_cpu - self.used_cpu >= pod.cpu_milli),
            (reasons.INSUFFICIENT_MEMORY, self.alloc_mem - self.used_mem >= pod.memory_bytes),
            (reasons.INSUFFICIENT_GPU, gpu_ok),
        ):
            rejected = remaining & ~passes
            counts[reason] = int(rejected.sum())
            remaining &= passes
        return counts

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
        eligible = [i for i in range(len(used)) if not pod.gpu_type or models[i] == pod.gpu_type]
        if pod.gpu_milli >= GPU_MILLI:
            free = [i for i in eligible if used[i] == 0][: pod.gpu_milli // GPU_MILLI]
            if len(free) < pod.gpu_milli // GPU_MILLI:
                return None
            return tuple(GpuShare(ids[i], GPU_MILLI) for i in free)
        room = [i for i in eligible if GPU_MILLI - used[i] >= pod.gpu_milli]
        if not room:
            return None
        best = max(room, key=lambda i: (used[i], -i))
        return (GpuShare(ids[best], pod.gpu_milli),)

    def apply(self, alloc: Allocation, sign: int = 1) -> None:
        """apply adds (sign=1) or removes (sign=-1) an allocation from the arrays."""
        n = alloc.node
        self.used_cpu[n] += sign * alloc.cpu_milli
        self.used_mem[n] += sign * alloc.memory_bytes
        if alloc.gpus:
            position = {gpu_id: i for i, gpu_id in enumerate(self.gpu_ids[n])}
            for share in alloc.gpus:
                self.gpu_used[n][position[share.index]] += sign * share.milli
            used = self.gpu_used[n]
            self.used_gpu[n] = sum(used)
            self.free_whole[n] = sum(1 for u in used if u == 0)
            self.best_share[n] = max((GPU_MILLI - u for u in used), default=0)
