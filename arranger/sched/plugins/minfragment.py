"""minfragment: the MinFragment basicPolicy, placement that leaves the fewest GPUs unusable.

It builds on FGD (Weng et al., ATC'23): a node's expected fragmentation F_n is the GPU capacity
the workload's typical pods could not use there (arranger.sched.fragmentation), and a pod goes
where F_n grows least. Against the request mix (the snapshot's `request_mix`, or else every pod
in the snapshot, waiting or running), for a pod with c cores and g GPUs on a node with C cores
and G GPUs free (C_max, G_max: the largest node's):

    score = steps(dF) - 0.25 leftover - w stranded - 0.025 scarcity
    steps(dF) = floor(100 / (1 + exp(dF / 1000)))         dF in milli-GPUs; 50 for no change
    leftover  = 0.5 (C - c) / C_max + 0.5 (G - g) / G_max  best fit among equal steps
    stranded  = max(0, k (G - g) - (C - c)) / (k G_max)   GPUs left without the cores to use them
    on nodes without GPUs, leftover also has |u_cpu - u_memory| after placement: cores left
    without memory or memory without cores

where k is the mix's cores per GPU and w the configured stranding weight (0.25). What it adds
to FGD, each measured with `arranger simulate` (bench/fragmentation.md):

- look-ahead: in F_n a free share that a class of the mix can still fill (at least the
  smallest fractional share asked for) counts half, one that none can fill counts fully;
  holes that will be filled matter less than dead ones;
- steps: near-equal increases tie (FGD's integer score, about 40 milli-GPU per step) and best
  fit decides among them, packing nodes instead of spreading;
- stranding: a node whose cores run out first strands its GPUs (a measure FGD misses for the
  pods it does not count);
- scarcity: when pods of the mix are bound to GPU models, the milli-GPUs a pod takes from a
  model times the pressure on it (the share of the mix's GPU demand only that model can serve,
  over its share of the free GPUs; _State.scarcity), less that of the least pressed model the
  pod allows. FGD's measure has no such term: to a class bound to another model every free GPU
  of a node counts as fragment, so taking any GPU there *lowers* F_n, and the nodes of a model
  that few classes may use attract the pods that could go anywhere. With many pods bound to a
  model that has few GPUs (T4 in openb), those pods then find their model full while other
  models have room. 0.025 is steps()'s slope at no change: a milli-GPU taken from bound pods
  weighs as a milli-GPU of fragment. Without bound classes the term is 0.

A share goes to the node's GPU with the best step (the lowest-numbered among equals).

Cost: scores are cached per request (cores, memory, GPUs, models) and recomputed only for nodes
whose usage changed since the class was last scored, so a cycle of many jobs asking alike
scores each node about once per class.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from arranger.sched.fragmentation import (
    Fragmentation,
    RequestClass,
    RequestMix,
    mix_of,
)
from arranger.sched.framework import Plugin, plugin
from arranger.sched.nodes import FloatArray, Index, IntArray, NodeArrays
from arranger.sched.plan import GpuShare
from arranger.sched.resources import Res
from arranger.sched.snapshot import GPU_MILLI, JobInfo, PodRequest, PodShape, pod_shapes
from arranger.states import BasicPolicy

LIVE_WEIGHT = 0.5  # how much a free share some class can still fill counts as fragment
LEFTOVER_WEIGHT = 0.25
# The slope of steps() at no change (100 / 4000 per milli-GPU): milli-GPUs that a placement
# takes from pods bound to a model count as much as milli-GPUs of fragment.
STEP_SLOPE = 0.025
FEW_NODES = 32  # up to this many changed nodes are rescored one by one, from scores by usage


@plugin
class MinFragment(Plugin):
    name = "minfragment"

    def open(self) -> None:
        self.nodes = self.session.nodes
        self._state: _State | None = None  # built when a MinFragment job is first scored
        self.session.scorers[BasicPolicy.MIN_FRAGMENT] = self.score
        self.session.gpu_choosers[BasicPolicy.MIN_FRAGMENT] = self.choose_gpus
        self.session.on_allocate.append(self._changed)

    def _changed(self, job: JobInfo, request: Res, node: int, sign: int) -> None:
        if self._state is not None:
            self._state.version[node] += 1
            self._state.dirty.add(node)
            self._state.pressure = None

    def state(self) -> _State:
        """state: the fragmentation measure, brought up to date with the node arrays."""
        state = self._live()
        state.catch_up()
        return state

    def _live(self) -> _State:
        """_live: the cycle's state, built on first use; its measure may lag the node arrays
        (_State's methods catch up when they need it)."""
        if self._state is None:
            snapshot, shapes = self.session.snapshot, self.session.index.shapes
            mix = snapshot.request_mix or (
                snapshot_mix(snapshot.jobs) if shapes is None else mix_of_shapes(shapes)
            )
            self._state = _State(self.nodes, mix, self.session.config.stranding_weight)
        return self._state

    def score(self, pod: PodRequest, job: JobInfo, at: Index) -> FloatArray:
        state = self._live()
        scarcity = state.scarcity(pod)
        if isinstance(at, int):
            value = state.one(pod, at)[0]
            if scarcity is not None:
                value -= float(scarcity[state.node_model[at]])
            return value  # type: ignore[return-value]  # one node: a float
        result: FloatArray = state.cached(pod).scores[at]
        if scarcity is not None:
            result = result - scarcity[state.node_model[at]]
        return result

    def choose_gpus(
        self, nodes: NodeArrays, node: int, pod: PodRequest
    ) -> tuple[GpuShare, ...] | None:
        if not 0 < pod.gpu_milli < GPU_MILLI or nodes is not self.nodes:
            return nodes.assign_gpus(node, pod)
        slot = self._live().one(pod, node)[1]
        if slot < 0:
            return None
        return (GpuShare(nodes.gpu_ids[node][slot], pod.gpu_milli),)


@dataclass
class _Scores:
    """_Scores: a request class's score on every node, the GPU (position) a share would take
    there (-1: none, or not a share), and the node versions they were computed at."""

    scores: FloatArray
    slots: IntArray
    version: IntArray


@dataclass
class _State:
    """_State is MinFragment's work for one cycle: the measure, node versions (bumped on every
    change of a node's usage), the nodes changed since they were measured, and per-class
    scores."""

    nodes: NodeArrays
    mix: RequestMix
    stranding_weight: float
    frag: Fragmentation = field(init=False)
    version: IntArray = field(init=False)
    dirty: set[int] = field(default_factory=set)
    cache: dict[tuple[int, int, int, frozenset[str]], _Scores] = field(default_factory=dict)

    def __post_init__(self) -> None:
        shares = [c.share for c in self.mix.classes if 0 < c.share < GPU_MILLI]
        live_from = min(shares, default=GPU_MILLI)
        self.frag = Fragmentation(self.nodes, self.mix, live_from, LIVE_WEIGHT)
        self.version = np.zeros(len(self.nodes), dtype=np.int64)
        nodes = self.nodes
        self.max_cpu = float(max(nodes.alloc_cpu.max(initial=0), 1))
        self.max_gpu = float(max(nodes.alloc_gpu.max(initial=0), 1))
        self.cores_per_gpu = cores_per_gpu(self.mix)
        self.gpuless = nodes.alloc_gpu == 0
        # kind[n]: nodes of one kind have the same capacity and the same classes of the mix
        # can use them, so the same usage gives them the same score; by_usage: scores (and
        # GPU position) by request, kind and usage.
        self.kind = kinds(
            [nodes.alloc_cpu, nodes.alloc_mem, nodes.alloc_gpu, np.array(self.frag.usable_kind)]
        )
        self.by_usage: dict[tuple[tuple[object, ...], tuple[int, ...]], tuple[float, int]] = {}
        self.models = sorted({m for have in nodes.model_sets for m in have})
        position = {m: i for i, m in enumerate(self.models)}
        # node_model[n]: the position of node n's (first) GPU model; -1 without GPUs.
        self.node_model: IntArray = np.array(
            [position[ms[0]] if ms else -1 for ms in nodes.gpu_models], dtype=np.int64
        )
        self.has_gpus = self.node_model >= 0
        capacity: FloatArray = np.bincount(
            self.node_model[self.has_gpus],
            weights=nodes.alloc_gpu[self.has_gpus],
            minlength=len(self.models),
        ).astype(np.float64)
        self.bound = bound_demand(self.mix, self.models, capacity)
        # The pressures as the nodes are now (None: to recompute), and per (GPUs, models)
        # asked the cost of each model derived from them.
        self.pressure: FloatArray | None = None
        self.costs: dict[tuple[int, frozenset[str]], FloatArray] = {}

    def catch_up(self) -> None:
        """catch_up refreshes the measure of every node changed since it was last measured."""
        if self.dirty:
            self.frag.refresh_many(np.fromiter(self.dirty, dtype=np.int64, count=len(self.dirty)))
            self.dirty.clear()

    def scarcity(self, pod: PodRequest) -> FloatArray | None:
        """scarcity: per GPU model (and a last 0 for nodes without GPUs), what placing the pod
        on a node of that model costs the pods bound to models, in score points: the
        milli-GPUs it takes times the pressure on the model, less the pressure of the least
        pressed model the pod allows (so its best choice costs nothing). None when no pod of
        the mix is bound to a model, or the pod asks for no GPU.

        The pressure on model X is b_X F / F_X, capped at 1: b_X is the share of the mix's GPU
        demand that only X (with the models listed beside it) can serve, F the free milli-GPUs
        of the cluster and F_X those of X. Filling the cluster from here, pods bound to X would
        want b_X F of X's F_X: pressure 1 means they want all of it, so a GPU of X that another
        pod takes is one they lose."""
        if self.bound is None or pod.gpu_milli == 0:
            return None
        key = (pod.gpu_milli, pod.gpu_models)
        if self.pressure is None:
            self.pressure = self.pressures(self.bound)
            self.costs.clear()
        cost = self.costs.get(key)
        if cost is None:
            pressure = self.pressure
            allowed = [i for i, m in enumerate(self.models) if m in pod.gpu_models]
            least = pressure[allowed].min() if allowed else pressure.min()
            cost = np.zeros(len(self.models) + 1)
            cost[:-1] = STEP_SLOPE * pod.gpu_milli * np.maximum(0.0, pressure - least)
            self.costs[key] = cost
        return cost

    def pressures(self, bound: FloatArray) -> FloatArray:
        """pressures: per model, b_X F / F_X capped at 1 (1 where nothing of X is free)."""
        nodes = self.nodes
        free = (nodes.alloc_gpu - nodes.used_gpu)[self.has_gpus]
        by_model = np.bincount(
            self.node_model[self.has_gpus], weights=free, minlength=len(self.models)
        )
        total = by_model.sum()
        with np.errstate(divide="ignore", invalid="ignore"):
            pressure: FloatArray = np.where(
                by_model > 0, np.minimum(1.0, bound * total / by_model), 1.0
            )
        return pressure

    def cached(self, pod: PodRequest) -> _Scores:
        """cached: the pod's class's scores, recomputed where nodes changed."""
        self.catch_up()
        key = _key(pod)
        entry = self.cache.get(key)
        if entry is None:
            scores, slots = self.node_scores(pod, np.arange(len(self.nodes)))
            entry = _Scores(scores, slots, self.version.copy())
            self.cache[key] = entry
            return entry
        stale = np.flatnonzero(entry.version != self.version)
        if len(stale) > FEW_NODES:
            entry.scores[stale], entry.slots[stale] = self.node_scores(pod, stale)
            entry.version[stale] = self.version[stale]
        else:
            # A gang's worth of changed nodes: one by one, mostly from the scores by usage
            # (a vectorised pass over a few nodes costs more in numpy's calls than it saves).
            for node in stale.tolist():
                self.one(pod, node)
        return entry

    def one(self, pod: PodRequest, node: int) -> tuple[float, int]:
        """one: the pod's score on one node and the GPU a share would take there, from the
        class's scores when they are current (and into them when not)."""
        key = _key(pod)
        entry = self.cache.get(key)
        if entry is not None and entry.version[node] == self.version[node]:
            return float(entry.scores[node]), int(entry.slots[node])
        # A node's score is a function of its kind and usage: nodes that went through the same
        # placements (the common case for a worker set's identical pods) share the work.
        nodes = self.nodes
        used_memory = int(nodes.used_mem[node]) if self.gpuless[node] else 0
        # The node's models matter beyond the classes that can use it only to a pod that
        # names models.
        models = nodes.gpu_models[node] if pod.gpu_models else ()
        usage = (*key, self.kind[node], models, int(nodes.used_cpu[node]), used_memory)
        usage_key = (usage, tuple(nodes.gpu_used[node]))
        found = self.by_usage.get(usage_key)
        if found is None:
            self.catch_up()
            scores, slots = self.node_scores(pod, np.array([node]))
            found = float(scores[0]), int(slots[0])
            self.by_usage[usage_key] = found
        if entry is not None:
            entry.scores[node], entry.slots[node] = found
            entry.version[node] = self.version[node]
        return found

    def node_scores(self, pod: PodRequest, idx: IntArray) -> tuple[FloatArray, IntArray]:
        """node_scores: the score of the nodes `idx` (-inf where no GPU has room for a share;
        nodes the pod does not fit get a number that placement masks), and for a share the
        position of the GPU it would take (the first of the best)."""
        slot: IntArray = np.full(len(idx), -1, dtype=np.int64)
        if 0 < pod.gpu_milli < GPU_MILLI:
            best: FloatArray = np.full(len(idx), -np.inf)
            rows, slots, grow = self.frag.share_increase(pod, idx)
            step = steps(grow)
            if len(idx) == 1 and len(rows):
                first = int(np.argmax(step))  # GPUs in order: the first of the best
                best[0], slot[0] = step[first], slots[first]
            elif len(rows):
                # rows are sorted: one run per node, its GPUs in order.
                new_run = np.empty(len(rows), dtype=np.bool_)
                new_run[0], new_run[1:] = True, rows[1:] != rows[:-1]
                starts = np.flatnonzero(new_run)
                top = np.maximum.reduceat(step, starts)
                best[rows[starts]] = top
                run = np.cumsum(new_run) - 1
                hits = np.flatnonzero(step == top[run])
                firsts = hits[np.flatnonzero(np.diff(run[hits], prepend=-1))]
                slot[rows[firsts]] = slots[firsts]
        else:
            best = steps(self.frag.increase(pod, idx))
        nodes = self.nodes
        cpu_left = nodes.alloc_cpu[idx] - nodes.used_cpu[idx] - pod.cpu_milli
        gpu_left = nodes.alloc_gpu[idx] - nodes.used_gpu[idx] - pod.gpu_milli
        leftover = 0.5 * cpu_left / self.max_cpu + 0.5 * gpu_left / self.max_gpu
        k = self.cores_per_gpu
        stranded = np.maximum(0.0, k * gpu_left - cpu_left) / (k * self.max_gpu)
        # Without GPUs the fragment is cores without memory or memory without cores.
        cpu_used, mem_used, _ = nodes.util_after(pod, idx)
        unbalanced = np.where(self.gpuless[idx], np.abs(cpu_used - mem_used), 0.0)
        score: FloatArray = (
            best - LEFTOVER_WEIGHT * (leftover + unbalanced) - self.stranding_weight * stranded
        )
        return score, slot


def _key(pod: PodRequest) -> tuple[int, int, int, frozenset[str]]:
    """_key: what a pod's scores depend on (memory only on nodes without GPUs, but there)."""
    return (pod.cpu_milli, pod.memory_bytes, pod.gpu_milli, pod.gpu_models)


def steps(grow: FloatArray) -> FloatArray:
    """steps: an increase of fragmentation (milli-GPUs) as FGD's integer score 0..100, 50 for
    no change: increases within about 40 milli-GPU of each other tie."""
    result: FloatArray = np.floor(100.0 / (1.0 + np.exp(grow / 1000.0)))
    return result


def cores_per_gpu(mix: RequestMix) -> float:
    """cores_per_gpu: cores asked per GPU over the mix's GPU classes (8 without any)."""
    cpu = gpu = 0.0
    for cls, weight in zip(mix.classes, mix.popularity, strict=True):
        if cls.count:
            cpu += weight * cls.cpu_milli
            gpu += weight * cls.share * cls.count
    return cpu / gpu if gpu else 8.0


def bound_demand(mix: RequestMix, models: list[str], capacity: FloatArray) -> FloatArray | None:
    """bound_demand: per model, the share of the mix's GPU demand (popularity x milli-GPUs)
    bound to it, a class allowing several models split among them by their GPUs; None when no
    class is bound to a model."""
    bound = np.zeros(len(models))
    demand = 0.0
    for cls, weight in zip(mix.classes, mix.popularity, strict=True):
        if not cls.count:
            continue
        milli = weight * cls.share * cls.count
        demand += milli
        allowed = [i for i, m in enumerate(models) if m in cls.gpu_type.split("|")]
        if cls.gpu_type and allowed:
            bound[allowed] += milli * capacity[allowed] / max(capacity[allowed].sum(), 1.0)
    if not demand or not bound.any():
        return None
    result: FloatArray = bound / demand
    return result


def kinds(columns: list[IntArray]) -> list[int]:
    """kinds numbers the nodes so that nodes with equal values in every column, and only
    those, get the same number (sorting, not a pass over the nodes in Python)."""
    count = len(columns[0])
    if count == 0:
        return []
    order = np.lexsort(columns[::-1])
    alike = np.stack([column[order] for column in columns])
    starts = np.ones(count, dtype=np.bool_)
    starts[1:] = (alike[:, 1:] != alike[:, :-1]).any(axis=0)
    kind = np.empty(count, dtype=np.int64)
    kind[order] = np.cumsum(starts) - 1
    result: list[int] = kind.tolist()
    return result


def snapshot_mix(jobs: tuple[JobInfo, ...]) -> RequestMix:
    """snapshot_mix: the request mix of every pod in the snapshot, waiting or running (a running
    pod's GPU models are not known: any)."""
    shapes: Counter[PodShape] = Counter()
    for job in jobs:
        shapes.update(pod_shapes(job))
    return mix_of_shapes(shapes)


def mix_of_shapes(shapes: Mapping[PodShape, int]) -> RequestMix:
    """mix_of_shapes: the request mix of pods counted by PodShape (JobIndex.shapes)."""
    classes: Counter[RequestClass] = Counter()
    for (cpu, gpu, models), count in shapes.items():
        classes[RequestClass.of(cpu, gpu, models)] += count
    return mix_of(classes)
