"""protocol replays a trace through the real scheduling core, as the FGD paper's experiment does.

Arrival order: the pods sorted by name, shuffled with random.Random(seed); then pods drawn
with replacement (same generator) from the list sorted by name until the cumulative GPU request
reaches `inflate` x the cluster's GPUs; the sequence stops at the first pod that reaches it
(a trace that already asks for more is cut there). Each pod is placed on its own, at once,
never leaves; one that fits nowhere (GPU, CPU, memory, GPU model) is dropped.

After each pod: arrived % = GPUs requested so far (dropped pods included) / capacity; allocated
% = GPUs placed / capacity. At the first pod where arrived % reaches each of POINTS the run
records unallocated % = 100 - allocated % and the fragmentation rate (fragmentation.py, in
percent of the free GPUs, against the trace's request mix).

Placement is the core's: a Session on a snapshot of the trace's nodes, with the predicates
plugin and the policy's plugin only, and place_all_or_nothing for each pod as a one-pod job.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

import arranger.sched.plugins  # noqa: F401 (registers the core's plugins)
from arranger.sched.cluster import Snapshot
from arranger.sched.config import SchedulerConfig
from arranger.sched.fragmentation import RequestMix, fragmentation_rate, request_mix
from arranger.sched.placement import place_all_or_nothing
from arranger.sched.plan import Placement
from arranger.sched.snapshot import (
    DEFAULT_QUEUE,
    JobInfo,
    NodeInfo,
    PodRequest,
    QueueInfo,
)
from arranger.sim.gpuspec import gpuspec_trace
from arranger.sim.policies import BASELINES, SimContext, SimSession
from arranger.sim.trace import Trace, load_trace
from arranger.states import BasicPolicy

POINTS = (80, 90, 95, 100, 110, 120, 130)
INFLATE = 1.3
GPUSPEC_SEED = 42
CORE_PLUGINS = {
    BasicPolicy.BINPACK: "binpack",
    BasicPolicy.GANG: "binpack",
    BasicPolicy.LEADER_FIRST: "leaderfirst",
    BasicPolicy.MIN_FRAGMENT: "minfragment",
    BasicPolicy.JOB_AFFINITY: "affinity",
    BasicPolicy.JOB_ANTI_AFFINITY: "affinity",
}


class UnknownPolicy(ValueError):
    """UnknownPolicy names the policies there are."""


@dataclass(frozen=True)
class Policy:
    """Policy is a name the simulator accepts: the plugin that scores and the basicPolicy the
    one-pod jobs carry (the baselines answer to every basicPolicy)."""

    name: str
    plugin: str
    basic: BasicPolicy


def policy(name: str) -> Policy:
    """policy resolves a baseline ("FGD", "sim-fgd") or a basicPolicy ("MinFragment"),
    ignoring case."""
    wanted = name.lower()
    for label, plugin_name in BASELINES.items():
        if wanted in (label.lower(), plugin_name):
            return Policy(label, plugin_name, BasicPolicy.BINPACK)
    for basic, plugin_name in CORE_PLUGINS.items():
        if wanted == basic.value.lower():
            return Policy(basic.value, plugin_name, basic)
    known = [*BASELINES, *(b.value for b in CORE_PLUGINS)]
    raise UnknownPolicy(f"unknown policy {name!r}; known: {', '.join(known)}")


def arrivals(
    pods: Sequence[PodRequest], seed: int, inflate: float, capacity_milli: int
) -> list[PodRequest]:
    """arrivals: the order pods arrive in (drawn pods get a "-x<n>" suffix: names stay
    unique). The last pod is the first whose arrival brings the request to `inflate` x
    capacity; without any GPU request in the trace the shuffled trace is all there is."""
    ordered = sorted(pods, key=lambda p: p.name)
    rng = random.Random(seed)
    shuffled = list(ordered)
    rng.shuffle(shuffled)
    target = Fraction(str(inflate)) * capacity_milli
    out: list[PodRequest] = []
    requested = 0
    for pod in shuffled:
        out.append(pod)
        requested += pod.gpu_milli
        if requested >= target:
            return out
    if not any(p.gpu_milli for p in ordered):
        return out
    while requested < target:
        drawn = rng.choice(ordered)
        out.append(replace(drawn, name=f"{drawn.name}-x{len(out) - len(ordered) + 1}"))
        requested += drawn.gpu_milli
    return out


@dataclass(frozen=True)
class Result:
    """Result is one replay. `unallocated` and `fragmentation` are percentages at POINTS
    (None where arrivals never reached the point); `curve` is (arrived %, unallocated %) at
    every whole arrived percent (taken at the first pod reaching it), for plots."""

    policy: str
    seed: int
    inflate: float
    pods_name: str
    nodes_name: str
    capacity_gpus: float
    arrived: int
    placed: int
    dropped: int
    seconds: float
    unallocated: dict[str, float | None]
    fragmentation: dict[str, float | None]
    curve: tuple[tuple[float, float], ...]

    def to_json(self, curve: bool = False) -> dict[str, object]:
        """to_json: the result as `arranger simulate` prints it (with the curve if asked)."""
        out: dict[str, object] = {
            "policy": self.policy,
            "seed": self.seed,
            "inflate": self.inflate,
            "pods": self.pods_name,
            "nodes": self.nodes_name,
            "gpus": self.capacity_gpus,
            "pods_arrived": self.arrived,
            "pods_placed": self.placed,
            "pods_dropped": self.dropped,
            "unallocated_gpu_pct": self.unallocated,
            "fragmentation_rate": self.fragmentation,
            "seconds": round(self.seconds, 2),
        }
        if curve:
            out["curve"] = [list(p) for p in self.curve]
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Result:
        """from_json reads back what to_json(curve=True) wrote."""
        return cls(
            policy=raw["policy"],
            seed=raw["seed"],
            inflate=raw["inflate"],
            pods_name=raw["pods"],
            nodes_name=raw["nodes"],
            capacity_gpus=raw["gpus"],
            arrived=raw["pods_arrived"],
            placed=raw["pods_placed"],
            dropped=raw["pods_dropped"],
            seconds=raw["seconds"],
            unallocated=raw["unallocated_gpu_pct"],
            fragmentation=raw["fragmentation_rate"],
            curve=tuple((float(x), float(y)) for x, y in raw.get("curve", [])),
        )


def simulate(trace: Trace, name: str, seed: int, inflate: float = INFLATE) -> Result:
    """simulate replays the trace under one policy and seed."""
    chosen = policy(name)
    start = time.perf_counter()
    capacity = trace.capacity_milli
    mix = request_mix(trace.pods)
    session = open_session(trace.nodes, chosen.plugin, seed, mix)
    percents = sorted({*range(1, math.floor(Fraction(str(inflate)) * 100) + 1), *POINTS})
    unallocated: dict[str, float | None] = {str(p): None for p in POINTS}
    fragmentation: dict[str, float | None] = {str(p): None for p in POINTS}
    curve: list[tuple[float, float]] = []
    requested = allocated = placed = 0
    order = arrivals(trace.pods, seed, inflate, capacity)
    nxt = 0
    for pod in order:
        if place(session, pod, chosen.basic) is not None:
            placed += 1
            allocated += pod.gpu_milli
        requested += pod.gpu_milli
        while nxt < len(percents) and capacity and requested * 100 >= percents[nxt] * capacity:
            point = percents[nxt]
            left = 100.0 - 100.0 * allocated / capacity
            curve.append((float(point), left))
            if point in POINTS:
                unallocated[str(point)] = round(left, 4)
                rate = 100.0 * fragmentation_rate(session.nodes, mix)
                fragmentation[str(point)] = round(rate, 4)
            nxt += 1
    return Result(
        policy=chosen.name,
        seed=seed,
        inflate=inflate,
        pods_name=trace.name,
        nodes_name=trace.nodes_name,
        capacity_gpus=capacity / 1000,
        arrived=len(order),
        placed=placed,
        dropped=len(order) - placed,
        seconds=time.perf_counter() - start,
        unallocated=unallocated,
        fragmentation=fragmentation,
        curve=tuple(curve),
    )


def open_session(
    nodes: tuple[NodeInfo, ...], plugin: str, seed: int, mix: RequestMix
) -> SimSession:
    """open_session: the cluster empty, with the predicates plugin and one scoring plugin; the
    baselines draw on numpy's generator seeded with `seed`."""
    snapshot = Snapshot(0.0, nodes, (), (QueueInfo(DEFAULT_QUEUE),), request_mix=mix)
    config = SchedulerConfig(tiers=(("predicates", plugin),))
    return SimSession(snapshot, config, SimContext(np.random.default_rng(seed), mix))


def place(
    session: SimSession, pod: PodRequest, basic: BasicPolicy = BasicPolicy.BINPACK
) -> Placement | None:
    """place puts one pod on the cluster for good, as a one-pod job; None if it fits nowhere."""
    job = JobInfo(pod.name, pod.name, DEFAULT_QUEUE, 0, 0.0, (pod,), basic_policy=basic)
    statement, misfit = place_all_or_nothing(session, job, [pod], explained=False)
    if misfit is not None:
        return None
    statement.commit(session.plan)
    return session.plan.placements[-1]


@dataclass(frozen=True)
class Task:
    """Task is one replay to run: files, policy, seed, inflation, and optionally the share of
    GPU pods to constrain to a GPU model (gpuspec.py; None: the pod list as it is)."""

    nodes_csv: Path
    pods_csv: Path
    policy: str
    seed: int
    inflate: float = INFLATE
    gpuspec_ratio: float | None = None
    gpuspec_seed: int = GPUSPEC_SEED


def run_all(tasks: Sequence[Task], processes: int = 1) -> list[Result]:
    """run_all runs the tasks (in `processes` worker processes when more than one), results in
    the order of the tasks."""
    if processes <= 1 or len(tasks) <= 1:
        return [run_task(t) for t in tasks]
    with ProcessPoolExecutor(max_workers=processes) as pool:
        return list(pool.map(run_task, tasks))


def run_task(task: Task) -> Result:
    trace = _trace(task.nodes_csv, task.pods_csv, task.gpuspec_ratio, task.gpuspec_seed)
    return simulate(trace, task.policy, task.seed, task.inflate)


@lru_cache(maxsize=4)
def _trace(nodes_csv: Path, pods_csv: Path, ratio: float | None, seed: int) -> Trace:
    if ratio is None:
        return load_trace(nodes_csv, pods_csv)
    return gpuspec_trace(_trace(nodes_csv, pods_csv, None, seed), ratio, seed)
