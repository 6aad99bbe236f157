"""nodes holds one cycle's mutable view of node capacity, as numpy arrays indexed by node.

Nodes are sorted by name, so "the first best node" is the tie-break by name. Placements update
the arrays in place; a statement undoes them exactly. A caller that keeps the arrays between
cycles (the server) updates only the nodes that changed and hands each cycle a copy.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from arranger.sched.plan import GpuShare
from arranger.sched.resources import Res
from arranger.sched.snapshot import (
    GPU_MILLI,
    SHARES_ENFORCED,
    SHARES_LOST,
    GpuInfo,
    NodeInfo,
    PodRequest,
)

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


class NodeArrays:
    """NodeArrays is the cluster as the placements so far in this cycle have left it.

    `emptied()` gives the same nodes with nothing used: that answers "could this ever fit?".
    `update` brings changed, new and gone nodes in, so a caller can keep the arrays from cycle
    to cycle instead of building them, and hand each cycle a copy (`handed_out`: copy on
    write) of which the cycle copies only the usage it changes (`for_cycle`). The per-GPU
    usage lists (`gpu_used`) are shared between copies and never changed in place: a change
    replaces the node's list.

    An unhealthy GPU (GpuInfo.problem; `gpu_sick`, `gpu_unhealthy`) reads wholly taken in
    `gpu_used`, and stays so whatever its pods release: no pod goes to it, and no eviction
    counts on it. `emptied()` takes it as well and free: once healed, a job could use it.
    """

    # The numpy columns and the per-node lists, for copying and reordering them alike.
    COLUMNS = (
        "schedulable",
        "ready",
        "containers",
        "shares_enforced",
        "shares_lost",
        "alloc_cpu",
        "alloc_mem",
        "alloc_gpu",
        "used_cpu",
        "used_mem",
        "used_gpu",
        "gpu_count",
        "free_whole",
        "best_share",
        "div_cpu",
        "div_mem",
        "div_gpu",
        "gpu_unhealthy",
    )
    LISTS = (
        "names",
        "labels",
        "gpu_models",
        "model_sets",
        "gpu_ids",
        "gpu_used",
        "gpu_zero",
        "gpu_sick",
    )
    # What placements change (apply): a cycle's own copy needs only these.
    USAGE = ("used_cpu", "used_mem", "used_gpu", "free_whole", "best_share")

    def __init__(self, nodes: Iterable[NodeInfo]) -> None:
        ordered = sorted(nodes, key=lambda n: n.name)
        self.names = [n.name for n in ordered]
        self.index = {name: i for i, name in enumerate(self.names)}
        self.labels: list[Mapping[str, str]] = [n.labels for n in ordered]
        self.gpu_models: list[tuple[str, ...]] = [tuple(g.model for g in n.gpus) for n in ordered]
        self.model_sets: list[frozenset[str]] = [frozenset(m) for m in self.gpu_models]
        self.gpu_ids: list[tuple[int, ...]] = [tuple(g.index for g in n.gpus) for n in ordered]
        self.gpu_used: list[list[int]] = [[_offered(g) for g in n.gpus] for n in ordered]
        self.gpu_zero: list[list[int]] = [[0] * len(used) for used in self.gpu_used]
        # Each node's unhealthy GPUs (their ids), and how many.
        self.gpu_sick: list[frozenset[int]] = [_sick(n) for n in ordered]
        self.gpu_unhealthy: IntArray = np.array([len(s) for s in self.gpu_sick], dtype=np.int64)
        self.schedulable: BoolArray = np.array([n.schedulable for n in ordered], dtype=np.bool_)
        self.ready: BoolArray = np.array([n.ready for n in ordered], dtype=np.bool_)
        self.containers: BoolArray = np.array([n.containers for n in ordered], dtype=np.bool_)
        self.shares_enforced: BoolArray = np.array(
            [n.shares == SHARES_ENFORCED for n in ordered], dtype=np.bool_
        )
        self.shares_lost: BoolArray = np.array(
            [n.shares == SHARES_LOST for n in ordered], dtype=np.bool_
        )
        self.alloc_cpu: IntArray = np.array([n.cpu_milli for n in ordered], dtype=np.int64)
        self.alloc_mem: IntArray = np.array([n.memory_bytes for n in ordered], dtype=np.int64)
        self.gpu_count: IntArray = np.array([len(u) for u in self.gpu_used], dtype=np.int64)
        self.alloc_gpu: IntArray = self.gpu_count * GPU_MILLI
        self.used_cpu: IntArray = np.array([n.used_cpu_milli for n in ordered], dtype=np.int64)
        self.used_mem: IntArray = np.array([n.used_memory_bytes for n in ordered], dtype=np.int64)
        self.used_gpu: IntArray = np.array([sum(u) for u in self.gpu_used], dtype=np.int64)
        self.free_whole: IntArray = np.array(
            [sum(1 for u in used if u == 0) for used in self.gpu_used], dtype=np.int64
        )
        self.best_share: IntArray = np.array(
            [max((GPU_MILLI - u for u in used), default=0) for used in self.gpu_used],
            dtype=np.int64,
        )
        # Divisors that are never zero, for utilisation.
        self.div_cpu: FloatArray = np.maximum(self.alloc_cpu, 1).astype(np.float64)
        self.div_mem: FloatArray = np.maximum(self.alloc_mem, 1).astype(np.float64)
        self.div_gpu: FloatArray = np.maximum(self.alloc_gpu, 1).astype(np.float64)
        # Labels kept as columns (keep_label): every node's value ("" without the label) and
        # which nodes have a value.
        self.label_columns: dict[str, tuple[list[str], BoolArray]] = {}
        # Columns, lists and label columns a handed-out copy may still share: update() copies
        # them before it changes them.
        self._shared: set[str] = set()
        self._shared_labels: set[str] = set()

    def keep_label(self, key: str) -> None:
        """keep_label keeps the label's column (label_column) with the arrays from now on:
        updated with them and copied with them."""
        if key not in self.label_columns:
            self.label_columns[key] = self._label_column(key)

    def label_column(self, key: str) -> tuple[list[str], BoolArray]:
        """label_column: every node's value of the label ("" where it has none) and which
        nodes have a value; kept if keep_label asked for it, else computed now."""
        kept = self.label_columns.get(key)
        return kept if kept is not None else self._label_column(key)

    def _label_column(self, key: str) -> tuple[list[str], BoolArray]:
        values = [labels.get(key, "") for labels in self.labels]
        return values, np.array([bool(v) for v in values], dtype=np.bool_)

    def copy(self) -> NodeArrays:
        """copy: the same nodes, in arrays and lists of its own (what changes in one does not
        change in the other). Costs a copy of each column, no work per node in Python."""
        other = copy.copy(self)
        for name in self.COLUMNS:
            setattr(other, name, getattr(self, name).copy())
        for name in self.LISTS:
            setattr(other, name, list(getattr(self, name)))
        other.label_columns = {
            key: (list(values), labelled.copy())
            for key, (values, labelled) in self.label_columns.items()
        }
        other._shared, other._shared_labels = set(), set()
        return other

    def handed_out(self) -> NodeArrays:
        """handed_out: a copy that shares every column and list with these arrays until
        update() changes one of them, on either side: it copies that one first (copy on
        write). Costs nothing now, and a copy of what changes later. Neither may be changed
        by apply() meanwhile (a cycle works on for_cycle() of it)."""
        other = copy.copy(self)
        other.label_columns = dict(self.label_columns)
        everything = set(self.COLUMNS + self.LISTS)
        self._shared, other._shared = everything, set(everything)
        self._shared_labels, other._shared_labels = set(self.label_columns), set(self.label_columns)
        return other

    def for_cycle(self) -> NodeArrays:
        """for_cycle: a copy whose usage changes apart from these arrays (placements); what a
        cycle never changes (capacity, labels, GPU models) is shared, so these arrays must not
        be updated while it is in use (a snapshot's arrays never are)."""
        other = copy.copy(self)
        for name in self.USAGE:
            setattr(other, name, getattr(self, name).copy())
        other.gpu_used = list(self.gpu_used)
        other.label_columns = dict(self.label_columns)
        other._shared = set(self.COLUMNS + self.LISTS) - set(self.USAGE) - {"gpu_used"}
        other._shared_labels = set(self.label_columns)
        return other

    def update(self, changed: Mapping[str, NodeInfo | None]) -> None:
        """update brings the nodes named in `changed` to their new NodeInfo (None: the node is
        gone), in place: afterwards the arrays equal NodeArrays built from the new set of nodes.
        A changed node costs O(its GPUs); a node that comes or goes costs one reordering of
        every column."""
        added: list[NodeInfo] = []
        gone: set[str] = set()
        for name, info in changed.items():
            at = self.index.get(name)
            if info is None:
                if at is not None:
                    gone.add(name)
            elif at is None:
                added.append(info)
            else:
                self._set(at, info)
        if added or gone:
            self._reorder(added, gone)

    def _set(self, at: int, n: NodeInfo) -> None:
        """_set makes row `at` the node `n` (of the same name), writing only what differs."""
        models = tuple(g.model for g in n.gpus)
        used = [_offered(g) for g in n.gpus]
        sick = _sick(n)
        row: dict[str, object] = {
            "gpu_sick": sick,
            "gpu_unhealthy": len(sick),
            "labels": n.labels,
            "gpu_models": models,
            "model_sets": frozenset(models),
            "gpu_ids": tuple(g.index for g in n.gpus),
            "gpu_used": used,
            "gpu_zero": [0] * len(used),
            "schedulable": n.schedulable,
            "ready": n.ready,
            "containers": n.containers,
            "shares_enforced": n.shares == SHARES_ENFORCED,
            "shares_lost": n.shares == SHARES_LOST,
            "alloc_cpu": n.cpu_milli,
            "alloc_mem": n.memory_bytes,
            "gpu_count": len(used),
            "alloc_gpu": len(used) * GPU_MILLI,
            "used_cpu": n.used_cpu_milli,
            "used_mem": n.used_memory_bytes,
            "used_gpu": sum(used),
            "free_whole": sum(1 for u in used if u == 0),
            "best_share": max((GPU_MILLI - u for u in used), default=0),
            "div_cpu": max(n.cpu_milli, 1),
            "div_mem": max(n.memory_bytes, 1),
            "div_gpu": max(len(used) * GPU_MILLI, 1),
        }
        for name, value in row.items():
            if getattr(self, name)[at] != value:
                self._own(name)[at] = value
        for key in list(self.label_columns):
            value = n.labels.get(key, "")
            if self.label_columns[key][0][at] != value:
                values, labelled = self._own_label(key)
                values[at], labelled[at] = value, bool(value)

    def _own_label(self, key: str) -> tuple[list[str], BoolArray]:
        """_own_label: the label's column, copied first if a handed-out copy shares it."""
        values, labelled = self.label_columns[key]
        if key in self._shared_labels:
            values, labelled = list(values), labelled.copy()
            self.label_columns[key] = (values, labelled)
            self._shared_labels.discard(key)
        return values, labelled

    def _own(self, name: str) -> Any:
        """_own: the column or list `name`, copied first if a handed-out copy shares it."""
        column = getattr(self, name)
        if name in self._shared:
            column = column.copy()
            setattr(self, name, column)
            self._shared.discard(name)
        return column

    def _reorder(self, added: list[NodeInfo], gone: set[str]) -> None:
        """_reorder drops the gone nodes, appends the added ones and sorts by name again."""
        keep = [i for i, name in enumerate(self.names) if name not in gone]
        extra = NodeArrays(added)
        names = [self.names[i] for i in keep] + extra.names
        order = sorted(range(len(names)), key=names.__getitem__)
        kept = np.array(keep, dtype=np.int64)
        at = np.array(order, dtype=np.int64)
        for name in self.COLUMNS:
            column = np.concatenate([getattr(self, name)[kept], getattr(extra, name)])
            setattr(self, name, column[at])
        for name in self.LISTS:
            values = [getattr(self, name)[i] for i in keep] + getattr(extra, name)
            setattr(self, name, [values[i] for i in order])
        self.index = {name: i for i, name in enumerate(self.names)}
        self.label_columns = {key: self._label_column(key) for key in self.label_columns}
        self._shared, self._shared_labels = set(), set()  # every column and list is new

    def emptied(self) -> NodeArrays:
        """emptied: the same nodes with nothing used, and every ready node usable, cordoned or
        briefly disconnected (a copy that shares what never changes)."""
        empty = copy.copy(self)
        empty.label_columns = dict(self.label_columns)
        empty._shared = set(self.COLUMNS + self.LISTS)  # what it does not replace below
        empty._shared_labels = set(self.label_columns)
        empty.gpu_used = list(self.gpu_zero)
        empty.gpu_sick = [frozenset()] * len(self.names)  # could it fit once they are well?
        empty.gpu_unhealthy = np.zeros_like(self.gpu_unhealthy)
        empty.schedulable = self.ready.copy()
        empty.used_cpu = np.zeros_like(self.used_cpu)
        empty.used_mem = np.zeros_like(self.used_mem)
        empty.used_gpu = np.zeros_like(self.used_gpu)
        empty.free_whole = self.gpu_count.copy()
        empty.best_share = np.where(empty.free_whole > 0, GPU_MILLI, 0).astype(np.int64)
        return empty

    def __len__(self) -> int:
        return len(self.names)

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


def _offered(gpu: GpuInfo) -> int:
    """_offered: the milli-GPUs of `gpu` a cycle counts as taken: all of an unhealthy one
    (nothing more goes to it), else what its pods hold."""
    return GPU_MILLI if gpu.problem else gpu.used_milli


def _sick(node: NodeInfo) -> frozenset[int]:
    """_sick: the ids of the node's unhealthy GPUs."""
    return frozenset(g.index for g in node.gpus if g.problem)
