"""policies: the published baselines of the FGD paper (Weng et al., ATC'23) as plugins of the
simulator's own registry (never the production one), so the simulator checks our numbers
against the paper's. Reimplemented from the paper and the descriptions of its simulator
(kubernetes-scheduler-simulator), not from its code.

The paper's simulator runs them inside the Kubernetes scheduler framework, and two traits of
it shape the published numbers, so they are kept. A node's score is an integer 0..100
(truncated), so many nodes tie. Ties go to the first node in one random order of the nodes,
drawn once per run (the integer score plus a per-node offset below 1/2): that simulator gives
every node a random name prefix for the run, and of the readings tried (a fresh random pick
per pod, the nodes' own names, a random order per run) only this one lands all five baselines
near the published medians (bench/fragmentation.md). With c, g the pod's CPU and GPU (milli)
and C, G a node's free CPU and GPU (milli, G summed over its GPUs):

- Random (sim-random): a uniformly random feasible node; a share goes to a random GPU with room.
- DotProd (sim-dotprod, Tetris): 100 (1 - (C/128k * c/128k + G/8k * g/8k) / 2): the node whose
  free resources align least with the request, i.e. the fullest in the request's direction.
- GpuPacking (sim-gpupacking): a share on a partially used GPU first (100 - its free tenths),
  then free GPUs on a used node (50 - GPUs taken), then an idle node (33 - its GPUs: small idle
  nodes first); CPU-only pods score 0 everywhere (so go to the run's first node that fits).
- BestFit (sim-bestfit): least leftover, 100 (1 - (0.5 (C - c)/128k + 0.5 (G - g)/8k)).
- FGD (sim-fgd): 100 sigmoid(-dF/1000) with dF the increase of the node's expected
  fragmentation F_n (see fragmentation.py); a share goes to the GPU with the best such score
  (the lowest-numbered among equals).

DotProd, GpuPacking and BestFit place a share on the GPU with the least room that fits (the
published "best" GPU selection); whole GPUs are always the lowest-numbered free ones. Each
baseline registers its own GPU choice, so they stay as published if the core's default changes.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from arranger.sched.cluster import Snapshot
from arranger.sched.config import SchedulerConfig
from arranger.sched.fragmentation import Fragmentation, FreeGpus, RequestMix
from arranger.sched.framework import PLUGINS, Plugin
from arranger.sched.nodes import FloatArray, Index, IntArray, NodeArrays
from arranger.sched.plan import GpuShare
from arranger.sched.session import Session
from arranger.sched.snapshot import GPU_MILLI, JobInfo, PodRequest
from arranger.states import BasicPolicy

MAX_CPU = 128_000.0  # DotProd's and BestFit's normalisers: the paper's largest node spec
MAX_GPU = 8_000.0
TIE_JITTER = 0.5  # below the step of the integer scores: it only orders equal ones
BASELINES = {
    "Random": "sim-random",
    "DotProd": "sim-dotprod",
    "GpuPacking": "sim-gpupacking",
    "BestFit": "sim-bestfit",
    "FGD": "sim-fgd",
}


@dataclass(frozen=True)
class SimContext:
    """SimContext is what the baselines need besides the session: the run's seeded generator
    (their only source of randomness) and the trace's request mix (FGD's target workload)."""

    rng: np.random.Generator
    mix: RequestMix


# The baselines are registered here only: the production registry (PLUGINS) never holds them,
# so a server's tiers cannot name them. A SimSession sees both.
SIM_PLUGINS: dict[str, type[Plugin]] = {}


class SimSession(Session):
    """SimSession is a Session that carries a SimContext for the baseline plugins (set before
    they open) and finds them in its registry beside the core's plugins."""

    registry: Mapping[str, type[Plugin]] = ChainMap(SIM_PLUGINS, PLUGINS)

    def __init__(self, snapshot: Snapshot, config: SchedulerConfig, context: SimContext) -> None:
        self.context = context
        super().__init__(snapshot, config)


def baseline(cls: type[Plugin]) -> type[Plugin]:
    """baseline registers a baseline plugin class under its name, for SimSession only."""
    SIM_PLUGINS[cls.name] = cls
    return cls


class Baseline(Plugin):
    """Baseline registers one scorer for every basicPolicy and its own GPU choice."""

    def open(self) -> None:
        session = self.session
        if not isinstance(session, SimSession):
            raise TypeError(f"plugin {self.name} runs only in the trace simulator")
        self.context = session.context
        self.nodes = session.nodes
        # The published simulator gives nodes random names, so a run's ties go the same way
        # for every pod: a random order of the nodes, drawn once, below the integer step.
        order = self.context.rng.permutation(len(self.nodes))
        self.priority: FloatArray = TIE_JITTER * order / max(len(self.nodes), 1)
        scorer = self.scorer()
        for policy in BasicPolicy:
            session.scorers[policy] = scorer
            session.gpu_choosers[policy] = self.choose_gpus

    def scorer(self) -> Callable[[PodRequest, JobInfo, Index], FloatArray]:
        raise NotImplementedError

    def choose_gpus(
        self, nodes: NodeArrays, node: int, pod: PodRequest
    ) -> tuple[GpuShare, ...] | None:
        return best_fit_gpus(nodes, node, pod)

    def ties(self, scores: FloatArray, idx: IntArray) -> FloatArray:
        """ties: the integer scores of the nodes `idx`, equal ones in the run's node order."""
        ordered: FloatArray = scores + self.priority[idx]
        return ordered


@baseline
class RandomFit(Baseline):
    name = "sim-random"

    def scorer(self) -> Callable[[PodRequest, JobInfo, Index], FloatArray]:
        count = len(self.nodes)

        def score(pod: PodRequest, job: JobInfo, at: Index) -> FloatArray:
            return over(at, count, lambda idx: self.context.rng.random(len(idx)))

        return score

    def choose_gpus(
        self, nodes: NodeArrays, node: int, pod: PodRequest
    ) -> tuple[GpuShare, ...] | None:
        if pod.gpu_milli >= GPU_MILLI or pod.gpu_milli == 0:
            return best_fit_gpus(nodes, node, pod)
        room = [i for i in eligible(nodes, node, pod) if room_on(nodes, node, i) >= pod.gpu_milli]
        if not room:
            return None
        pick = room[int(self.context.rng.integers(len(room)))]
        return (GpuShare(nodes.gpu_ids[node][pick], pod.gpu_milli),)


@baseline
class DotProd(Baseline):
    name = "sim-dotprod"

    def scorer(self) -> Callable[[PodRequest, JobInfo, Index], FloatArray]:
        nodes = self.nodes

        def score(pod: PodRequest, job: JobInfo, at: Index) -> FloatArray:
            def fn(idx: IntArray) -> FloatArray:
                cpu, gpu = free_cpu(nodes, idx) / MAX_CPU, free_gpu(nodes, idx) / MAX_GPU
                dot = cpu * (pod.cpu_milli / MAX_CPU) + gpu * (pod.gpu_milli / MAX_GPU)
                return self.ties(np.floor(100.0 * (1.0 - dot / 2.0)), idx)

            return over(at, len(nodes), fn)

        return score


@baseline
class GpuPacking(Baseline):
    name = "sim-gpupacking"

    def open(self) -> None:
        super().open()
        self.free = FreeGpus(self.nodes)
        self.session.on_allocate.append(lambda job, request, node, sign: self.free.refresh(node))

    def scorer(self) -> Callable[[PodRequest, JobInfo, Index], FloatArray]:
        nodes = self.nodes
        gpus = np.array([len(used) for used in nodes.gpu_used], dtype=np.int64)

        def score(pod: PodRequest, job: JobInfo, at: Index) -> FloatArray:
            def fn(idx: IntArray) -> FloatArray:
                if pod.gpu_milli == 0:
                    return self.ties(np.zeros(len(idx)), idx)
                if pod.gpu_milli >= GPU_MILLI:  # only free GPUs: case 2 on a used node
                    used_node = np.full(len(idx), max(50 - pod.gpu_milli // GPU_MILLI, 33))
                else:  # the GPU it would take: the one with the least room that fits
                    g = self.free.matrix[idx]
                    fits = (g >= pod.gpu_milli) & self.free.allowed(pod.gpu_models)[idx]
                    least = np.where(fits, g, GPU_MILLI + 1).min(axis=1, initial=GPU_MILLI + 1)
                    used_node = np.where(least >= GPU_MILLI, 49, np.maximum(100 - least // 100, 50))
                idle = nodes.free_whole[idx] == gpus[idx]
                packed = np.where(idle, np.maximum(33 - gpus[idx], gpus[idx]), used_node)
                return self.ties(packed.astype(np.float64), idx)

            return over(at, len(nodes), fn)

        return score


@baseline
class BestFit(Baseline):
    name = "sim-bestfit"

    def scorer(self) -> Callable[[PodRequest, JobInfo, Index], FloatArray]:
        nodes = self.nodes

        def score(pod: PodRequest, job: JobInfo, at: Index) -> FloatArray:
            def fn(idx: IntArray) -> FloatArray:
                cpu = (free_cpu(nodes, idx) - pod.cpu_milli) / MAX_CPU * 0.5
                gpu = (free_gpu(nodes, idx) - pod.gpu_milli) / MAX_GPU * 0.5
                return self.ties(np.floor((1.0 - (cpu + gpu)) * 100.0), idx)

            return over(at, len(nodes), fn)

        return score


@baseline
class Fgd(Baseline):
    name = "sim-fgd"

    def open(self) -> None:
        super().open()
        self.frag = Fragmentation(self.nodes, self.context.mix)
        self.session.on_allocate.append(lambda job, request, node, sign: self.frag.refresh(node))

    def scorer(self) -> Callable[[PodRequest, JobInfo, Index], FloatArray]:
        session, nodes = self.session, self.nodes

        def score(pod: PodRequest, job: JobInfo, at: Index) -> FloatArray:
            def fn(idx: IntArray) -> FloatArray:
                # Only the nodes the pod fits are worth the work; the engine masks the rest.
                fit = session.static_mask(pod, job)[idx] & nodes.fits(pod, idx)
                result = np.full(len(idx), -np.inf)
                if fit.any():
                    result[fit] = self.ties(self.node_scores(pod, idx[fit]), idx[fit])
                return result

            return over(at, len(nodes), fn)

        return score

    def node_scores(self, pod: PodRequest, idx: IntArray) -> FloatArray:
        """node_scores: each node's score; for a share, that of its best GPU."""
        if not 0 < pod.gpu_milli < GPU_MILLI:
            return fgd_score(self.frag.increase(pod, idx))
        rows, _, grow = self.frag.share_increase(pod, idx)
        best = np.full(len(idx), -1.0)
        np.maximum.at(best, rows, fgd_score(grow))
        return best

    def choose_gpus(
        self, nodes: NodeArrays, node: int, pod: PodRequest
    ) -> tuple[GpuShare, ...] | None:
        if not 0 < pod.gpu_milli < GPU_MILLI:
            return best_fit_gpus(nodes, node, pod)
        _, slots, grow = self.frag.share_increase(pod, np.array([node]))
        if not len(slots):
            return None
        best = int(np.argmax(fgd_score(grow)))  # GPUs in order: the first of the best
        return (GpuShare(nodes.gpu_ids[node][int(slots[best])], pod.gpu_milli),)


def fgd_score(grow: FloatArray) -> FloatArray:
    """fgd_score: the published node score of a fragmentation increase (milli-GPUs), an
    integer 0..100, 50 for no change."""
    scores: FloatArray = np.floor(1.0 / (1.0 + np.exp(grow / 1000.0)) * 100.0)
    return scores


def over(at: Index, count: int, fn: Callable[[IntArray], FloatArray]) -> FloatArray:
    """over evaluates a vectorised score on the nodes `at` (a Python number for one node)."""
    if isinstance(at, int):
        return float(fn(np.array([at]))[0])  # type: ignore[return-value]
    idx: IntArray = np.arange(count)[at]
    return fn(idx)


def free_cpu(nodes: NodeArrays, idx: IntArray) -> FloatArray:
    free: FloatArray = (nodes.alloc_cpu[idx] - nodes.used_cpu[idx]).astype(np.float64)
    return free


def free_gpu(nodes: NodeArrays, idx: IntArray) -> FloatArray:
    free: FloatArray = (nodes.alloc_gpu[idx] - nodes.used_gpu[idx]).astype(np.float64)
    return free


def eligible(nodes: NodeArrays, node: int, pod: PodRequest) -> list[int]:
    """eligible: positions of the node's GPUs of a model the pod allows."""
    models = nodes.gpu_models[node]
    return [i for i in range(len(models)) if not pod.gpu_models or models[i] in pod.gpu_models]


def room_on(nodes: NodeArrays, node: int, position: int) -> int:
    return GPU_MILLI - nodes.gpu_used[node][position]


def best_fit_gpus(nodes: NodeArrays, node: int, pod: PodRequest) -> tuple[GpuShare, ...] | None:
    """best_fit_gpus: whole GPUs, the lowest-numbered free ones; a share, the GPU with the least
    room that still fits (the lowest-numbered among equals)."""
    if pod.gpu_milli == 0:
        return ()
    ids = nodes.gpu_ids[node]
    positions = eligible(nodes, node, pod)
    if pod.gpu_milli >= GPU_MILLI:
        wanted = pod.gpu_milli // GPU_MILLI
        free = [i for i in positions if nodes.gpu_used[node][i] == 0][:wanted]
        if len(free) < wanted:
            return None
        return tuple(GpuShare(ids[i], GPU_MILLI) for i in free)
    room = [i for i in positions if room_on(nodes, node, i) >= pod.gpu_milli]
    if not room:
        return None
    best = min(room, key=lambda i: (room_on(nodes, node, i), i))
    return (GpuShare(ids[best], pod.gpu_milli),)
