"""node_columns holds the nodes' values as columns: one row per node, sorted by name, in numpy
arrays (what a cycle computes over) and in lists (labels, GPU models and usage, per node).

Built from NodeInfo; copied whole (`copy`), for a cycle that changes only usage (`for_cycle`),
with nothing used (`emptied`), or kept from cycle to cycle by a caller (the server) that
updates only the nodes that changed (`update`) and hands each cycle a copy on write
(`handed_out`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any, Self

import numpy as np
import numpy.typing as npt

from arranger.sched.snapshot import (
    GPU_MILLI,
    SHARES_ENFORCED,
    SHARES_LOST,
    GpuInfo,
    NodeInfo,
)


class NodeColumns:
    """NodeColumns is the nodes' columns and per-node lists, sorted by name (`index`: a
    node's row by name).

    `emptied()` gives the same nodes with nothing used: that answers "could this ever fit?".
    `update` brings changed, new and gone nodes in, so a caller can keep the columns from cycle
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
        self.gpu_unhealthy: npt.NDArray[np.int64] = np.array(
            [len(s) for s in self.gpu_sick], dtype=np.int64
        )
        self.schedulable: npt.NDArray[np.bool_] = np.array(
            [n.schedulable for n in ordered], dtype=np.bool_
        )
        self.ready: npt.NDArray[np.bool_] = np.array([n.ready for n in ordered], dtype=np.bool_)
        self.containers: npt.NDArray[np.bool_] = np.array(
            [n.containers for n in ordered], dtype=np.bool_
        )
        self.shares_enforced: npt.NDArray[np.bool_] = np.array(
            [n.shares == SHARES_ENFORCED for n in ordered], dtype=np.bool_
        )
        self.shares_lost: npt.NDArray[np.bool_] = np.array(
            [n.shares == SHARES_LOST for n in ordered], dtype=np.bool_
        )
        self.alloc_cpu: npt.NDArray[np.int64] = np.array(
            [n.cpu_milli for n in ordered], dtype=np.int64
        )
        self.alloc_mem: npt.NDArray[np.int64] = np.array(
            [n.memory_bytes for n in ordered], dtype=np.int64
        )
        self.gpu_count: npt.NDArray[np.int64] = np.array(
            [len(u) for u in self.gpu_used], dtype=np.int64
        )
        self.alloc_gpu: npt.NDArray[np.int64] = self.gpu_count * GPU_MILLI
        self.used_cpu: npt.NDArray[np.int64] = np.array(
            [n.used_cpu_milli for n in ordered], dtype=np.int64
        )
        self.used_mem: npt.NDArray[np.int64] = np.array(
            [n.used_memory_bytes for n in ordered], dtype=np.int64
        )
        self.used_gpu: npt.NDArray[np.int64] = np.array(
            [sum(u) for u in self.gpu_used], dtype=np.int64
        )
        self.free_whole: npt.NDArray[np.int64] = np.array(
            [sum(1 for u in used if u == 0) for used in self.gpu_used], dtype=np.int64
        )
        self.best_share: npt.NDArray[np.int64] = np.array(
            [max((GPU_MILLI - u for u in used), default=0) for used in self.gpu_used],
            dtype=np.int64,
        )
        # Divisors that are never zero, for utilisation.
        self.div_cpu: npt.NDArray[np.float64] = np.maximum(self.alloc_cpu, 1).astype(np.float64)
        self.div_mem: npt.NDArray[np.float64] = np.maximum(self.alloc_mem, 1).astype(np.float64)
        self.div_gpu: npt.NDArray[np.float64] = np.maximum(self.alloc_gpu, 1).astype(np.float64)
        # Labels kept as columns (keep_label): every node's value ("" without the label) and
        # which nodes have a value.
        self.label_columns: dict[str, tuple[list[str], npt.NDArray[np.bool_]]] = {}
        # Columns, lists and label columns a handed-out copy may still share: update() copies
        # them before it changes them.
        self._shared: set[str] = set()
        self._shared_labels: set[str] = set()

    def keep_label(self, key: str) -> None:
        """keep_label keeps the label's column (label_column) with the arrays from now on:
        updated with them and copied with them."""
        if key not in self.label_columns:
            self.label_columns[key] = self._label_column(key)

    def label_column(self, key: str) -> tuple[list[str], npt.NDArray[np.bool_]]:
        """label_column: every node's value of the label ("" where it has none) and which
        nodes have a value; kept if keep_label asked for it, else computed now."""
        kept = self.label_columns.get(key)
        return kept if kept is not None else self._label_column(key)

    def _label_column(self, key: str) -> tuple[list[str], npt.NDArray[np.bool_]]:
        values = [labels.get(key, "") for labels in self.labels]
        return values, np.array([bool(v) for v in values], dtype=np.bool_)

    def copy(self) -> Self:
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

    def handed_out(self) -> Self:
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

    def for_cycle(self) -> Self:
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
        gone), in place: afterwards the columns equal those built from the new set of nodes.
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

    def _own_label(self, key: str) -> tuple[list[str], npt.NDArray[np.bool_]]:
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
        extra = type(self)(added)
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

    def emptied(self) -> Self:
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


def _offered(gpu: GpuInfo) -> int:
    """_offered: the milli-GPUs of `gpu` a cycle counts as taken: all of an unhealthy one
    (nothing more goes to it), else what its pods hold."""
    return GPU_MILLI if gpu.problem else gpu.used_milli


def _sick(node: NodeInfo) -> frozenset[int]:
    """_sick: the ids of the node's unhealthy GPUs."""
    return frozenset(g.index for g in node.gpus if g.problem)
