"""fragmentation is FGD's measure of GPU fragmentation (Weng et al., ATC'23), vectorised over
nodes.

Pods are grouped into request classes m = (cpu, per-GPU share d, GPU count k, allowed models);
the most frequent classes covering 95 % of the pods are kept, with popularity p_m (summing to 1).
For a node with free per-GPU shares g_i (0..1000) and free CPU c:

    F_n(m) = sum of the g_i below d     if m asks for GPUs, a model the node has, at least k
                                        GPUs with g_i >= d, and cpu_m <= c (m fits: what it
                                        cannot use of the node is fragment);
    F_n(m) = sum of all g_i             otherwise (CPU-only classes included: to them every
                                        free GPU is stranded);
    F_n    = sum_m p_m F_n(m)           (milli-GPUs), and the cluster's fragmentation rate is
                                        sum_n F_n / sum_n sum_i g_i.

MinFragment looks one step ahead: a hole that a common class can still fill (free share at least
`live_from`) will likely be filled before it matters, so it counts only `live_weight` of itself
in the sums of shares below d_m; smaller holes count fully. live_weight 1 is FGD's measure.

To score every node for every pod quickly, the per-class statistics of each node (the sum of
its GPUs' free shares below d_m and the count at or above d_m) are kept in N x M arrays and
recomputed only for the node a placement changed.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from arranger.sched.nodes import BoolArray, FloatArray, IntArray, NodeArrays
from arranger.sched.snapshot import GPU_MILLI, PodRequest

COVERAGE = 0.95


@dataclass(frozen=True, order=True)
class RequestClass:
    """RequestClass is a kind of pod in FGD's sense: CPU, the share of each GPU (0: CPU-only),
    the number of GPUs, and the GPU models allowed ("" any; several sorted, "|"-separated)."""

    cpu_milli: int
    share: int
    count: int
    gpu_type: str

    @classmethod
    def of(
        cls, cpu_milli: int, gpu_milli: int, models: frozenset[str] = frozenset()
    ) -> RequestClass:
        """of: the class of a request (whole GPUs have share 1000)."""
        gpu_type = "|".join(sorted(models))
        if gpu_milli == 0:
            return cls(cpu_milli, 0, 0, gpu_type)
        if gpu_milli < GPU_MILLI:
            return cls(cpu_milli, gpu_milli, 1, gpu_type)
        return cls(cpu_milli, GPU_MILLI, gpu_milli // GPU_MILLI, gpu_type)


def request_class(pod: PodRequest) -> RequestClass:
    """request_class: the class of a pod."""
    return RequestClass.of(pod.cpu_milli, pod.gpu_milli, pod.gpu_models)


@dataclass(frozen=True)
class RequestMix:
    """RequestMix is the target workload: classes and their popularity (summing to 1)."""

    classes: tuple[RequestClass, ...]
    popularity: tuple[float, ...]


def request_mix(pods: Iterable[PodRequest], coverage: float = COVERAGE) -> RequestMix:
    """request_mix: the mix of the pods' classes (see mix_of)."""
    return mix_of(Counter(request_class(p) for p in pods), coverage)


def mix_of(counts: Mapping[RequestClass, int], coverage: float = COVERAGE) -> RequestMix:
    """mix_of keeps the most frequent classes until they cover `coverage` of the pods counted
    (ties in frequency: the larger class first, so the order is total) and renormalises."""
    total = sum(counts.values())
    ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    kept: list[tuple[RequestClass, int]] = []
    covered = 0
    for cls, count in ranked:
        if total and covered >= coverage * total:
            break
        kept.append((cls, count))
        covered += count
    return RequestMix(
        tuple(c for c, _ in kept), tuple(n / covered for _, n in kept) if covered else ()
    )


class FreeGpus:
    """FreeGpus is every node's free milli-GPUs per GPU as an N x S matrix (S: the most GPUs
    any node has; a node's missing GPUs read 0), kept in step with NodeArrays by `refresh`."""

    def __init__(self, nodes: NodeArrays) -> None:
        self.nodes = nodes
        counts = nodes.gpu_count
        self.slots = int(counts.max(initial=0))
        self.matrix: IntArray = np.zeros((len(nodes), self.slots), dtype=np.int64)
        # Every node's row at once: GPU j of node n is the (start of n + j)-th GPU in all.
        total = int(counts.sum())
        used = np.fromiter(itertools.chain.from_iterable(nodes.gpu_used), np.int64, total)
        rows = np.repeat(np.arange(len(nodes)), counts)
        slots = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        self.matrix[rows, slots] = GPU_MILLI - used
        self._models: dict[frozenset[str], BoolArray] = {}

    def refresh(self, node: int) -> None:
        used = self.nodes.gpu_used[node]
        self.matrix[node, : len(used)] = [GPU_MILLI - u for u in used]

    def allowed(self, models: frozenset[str]) -> BoolArray:
        """allowed: N x S, the GPUs of a model in `models` (every existing GPU if empty)."""
        mask = self._models.get(models)
        if mask is None:
            mask = np.zeros(self.matrix.shape, dtype=np.bool_)
            for node, names in enumerate(self.nodes.gpu_models):
                mask[node, : len(names)] = [not models or m in models for m in names]
            self._models[models] = mask
        return mask


class Fragmentation:
    """Fragmentation is F_n for every node against one request mix, and how much F_n would
    increase if a pod were placed, for every node at once.

    Call `refresh(node)` after the node's usage changed (the statistics are per node).
    """

    def __init__(
        self,
        nodes: NodeArrays,
        mix: RequestMix,
        live_from: int = GPU_MILLI,
        live_weight: float = 1.0,
    ) -> None:
        self.nodes = nodes
        # weight[g]: how much a free share g (milli-GPU) counts when it is a fragment.
        self.weight: FloatArray = np.ones(GPU_MILLI + 1)
        self.weight[live_from:] = live_weight
        self.free = FreeGpus(nodes)
        classes = mix.classes
        self.cpu: IntArray = np.array([c.cpu_milli for c in classes], dtype=np.int64)
        self.share: IntArray = np.array([c.share for c in classes], dtype=np.int64)
        self.count: IntArray = np.array([c.count for c in classes], dtype=np.int64)
        self.popularity: FloatArray = np.array(mix.popularity, dtype=np.float64)
        models = [frozenset(m for m in c.gpu_type.split("|") if m) for c in classes]
        # Nodes with the same GPU models are alike here: each set of models (numbered in the
        # order the nodes first have it) is worked out once.
        numbers: dict[frozenset[str], int] = {}
        model_set = np.fromiter(
            (numbers.setdefault(have, len(numbers)) for have in nodes.model_sets),
            np.int64,
            len(nodes),
        )
        # usable[n, m]: class m asks for GPUs and node n has a model it allows.
        usable_by_set: BoolArray = np.array(
            [
                [
                    c.count > 0 and (not ms or bool(ms & have))
                    for c, ms in zip(classes, models, strict=True)
                ]
                for have in numbers
            ],
            dtype=np.bool_,
        ).reshape(len(numbers), len(classes))
        self.usable: BoolArray = usable_by_set[model_set]
        # usable_kind[n]: nodes with the same row of `usable` share an id (numbered in the
        # order the nodes first have the row).
        rows: dict[bytes, int] = {}
        kind_by_set = np.array(
            [rows.setdefault(row.tobytes(), len(rows)) for row in usable_by_set], dtype=np.int64
        )
        self.usable_kind: list[int] = kind_by_set[model_set].tolist()
        self.total, self.below, self.fitting = self._stats(self.free.matrix)
        self._by_usage: dict[
            tuple[int, int, tuple[int, ...]], tuple[int, FloatArray, IntArray, float]
        ] = {}
        self.current: FloatArray = self._values(np.arange(len(nodes)))
        # earlier[j, k]: GPU k comes before GPU j (to keep one GPU of each free share).
        self.earlier: BoolArray = np.tri(self.free.slots, k=-1, dtype=np.bool_)

    def refresh(self, node: int) -> None:
        """refresh recomputes one node's statistics from the node arrays."""
        self.refresh_many(np.array([node]))

    def refresh_many(self, idx: IntArray) -> None:
        """refresh_many recomputes the statistics of the nodes `idx` at once."""
        for node in idx.tolist():
            self.free.refresh(node)
        if len(idx) == 1:
            self._refresh_one(int(idx[0]))
            return
        self.total[idx], self.below[idx], self.fitting[idx] = self._stats(self.free.matrix[idx])
        self.current[idx] = self._values(idx)

    def _refresh_one(self, node: int) -> None:
        """_refresh_one: one node's statistics, computed once per (classes that can use the
        node, free cores, free shares) and copied for every node that reaches the same usage."""
        key = (
            self.usable_kind[node],
            int(self.nodes.alloc_cpu[node] - self.nodes.used_cpu[node]),
            tuple(self.nodes.gpu_used[node]),
        )
        found = self._by_usage.get(key)
        if found is None:
            idx = np.array([node])
            self.total[idx], self.below[idx], self.fitting[idx] = self._stats(self.free.matrix[idx])
            self.current[idx] = self._values(idx)
            found = (
                int(self.total[node]),
                self.below[node].copy(),
                self.fitting[node].copy(),
                float(self.current[node]),
            )
            self._by_usage[key] = found
            return
        self.total[node], self.below[node], self.fitting[node], self.current[node] = found

    def _stats(self, free: IntArray) -> tuple[IntArray, FloatArray, IntArray]:
        """_stats: per node, the free total; per node and class, the free shares below d_m
        summed, and the number of GPUs with at least d_m free."""
        small = free[:, :, None] < self.share[None, None, :]
        below: FloatArray = ((free * self.weight[free])[:, :, None] * small).sum(axis=1)
        fitting: IntArray = (~small).sum(axis=1)
        total: IntArray = free.sum(axis=1)
        return total, below, fitting

    def free_cpu(self, idx: IntArray) -> IntArray:
        cpu: IntArray = self.nodes.alloc_cpu[idx] - self.nodes.used_cpu[idx]
        return cpu

    def values(self, idx: IntArray) -> FloatArray:
        """values: F_n of the nodes `idx` as they are."""
        frag: FloatArray = self.current[idx]
        return frag

    def _values(self, idx: IntArray) -> FloatArray:
        ok = (
            self.usable[idx]
            & (self.fitting[idx] >= self.count)
            & (self.free_cpu(idx)[:, None] >= self.cpu)
        )
        frag: FloatArray = np.where(ok, self.below[idx], self.total[idx][:, None]) @ self.popularity
        return frag

    def increase(self, pod: PodRequest, idx: IntArray) -> FloatArray:
        """increase: how much F_n grows if the pod (CPU-only or whole GPUs) goes to each node of
        `idx` (the nodes must fit it). Whole GPUs are entirely free ones, so they counted in
        every class's fitting GPUs and in no class's small shares."""
        whole = pod.gpu_milli // GPU_MILLI
        cpu = self.free_cpu(idx) - pod.cpu_milli
        ok = (
            self.usable[idx]
            & (self.fitting[idx] - whole >= self.count)
            & (cpu[:, None] >= self.cpu)
        )
        total = self.total[idx] - whole * GPU_MILLI
        after: FloatArray = np.where(ok, self.below[idx], total[:, None]) @ self.popularity
        return after - self.current[idx]

    def share_increase(
        self, pod: PodRequest, idx: IntArray
    ) -> tuple[IntArray, IntArray, FloatArray]:
        """share_increase: for a pod asking for a share of one GPU, the GPUs it could take on
        the nodes `idx` and how much F_n grows for each: (position in idx, GPU position on the
        node, increase), by node then GPU. GPUs with the same free share on a node are the same
        choice: only the first is listed."""
        d = pod.gpu_milli
        g = self.free.matrix[idx]  # n x S
        room = (g >= d) & self.free.allowed(pod.gpu_models)[idx]
        same = (g[:, :, None] == g[:, None, :]) & room[:, None, :] & self.earlier
        rows, slots = np.nonzero(room & ~same.any(axis=2))
        nodes = idx[rows]
        had = g[rows, slots][:, None]
        left = had - d
        share = self.share[None, :]
        below = (
            self.below[nodes]
            - np.where(had < share, had * self.weight[had], 0.0)
            + np.where(left < share, left * self.weight[left], 0.0)
        )
        fitting = self.fitting[nodes] - (had >= share) + (left >= share)
        ok = (
            self.usable[nodes]
            & (fitting >= self.count)
            & ((self.free_cpu(nodes) - pod.cpu_milli)[:, None] >= self.cpu)
        )
        after: FloatArray = np.where(ok, below, (self.total[nodes] - d)[:, None]) @ self.popularity
        return rows, slots, after - self.current[nodes]


def fragmentation_rate(nodes: NodeArrays, mix: RequestMix) -> float:
    """fragmentation_rate: expected fragmented GPU over free GPU in the whole cluster (0 when
    no GPU is free)."""
    frag = Fragmentation(nodes, mix)
    everything = np.arange(len(nodes))
    free = float(frag.total.sum())
    return float(frag.values(everything).sum()) / free if free else 0.0
