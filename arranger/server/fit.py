"""fit says, when a job is submitted, why it cannot run on the cluster as it is now, so the
user learns at once rather than from a job that waits forever; the job is queued all the same
(nodes may join).

It compares the job with the capacity of the Ready, schedulable nodes, not their free room: a
pod whose request no single node could hold however empty (honouring its nodeSelector, GPU
type and container image), and a gang minimum larger than all of them together. It never warns
of a job that could fit; some that cannot (a queue's machine groups, a scarce GPU type) pass
without a warning.

A submit must not cost a pass over every node: the nodes are summed up once in a Fleet (their
largest and total sizes, and the distinct node shapes, few in any real cluster), which the
server reuses until the node count changes or FLEET_AGE_S passes. A pod template without a
nodeSelector, GPU type or image is checked against the Fleet alone; one with them filters its
nodes (rare).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from arranger.quantity import format_memory
from arranger.server.model import NodeRecord
from arranger.spec import JobSpec, PodTemplate
from arranger.states import BasicPolicy

GPU_MILLI = 1000
# How long a Fleet answers for nodes whose count has not changed: summing 5,000 nodes up takes
# about 17 ms, which once a second cost each of 100 submits a second 0.17 ms.
FLEET_AGE_S = 5.0


@dataclass(frozen=True)
class Fleet:
    """Fleet: the Ready, schedulable nodes, their largest and total sizes, and their distinct
    (cores, memory, GPUs) shapes."""

    nodes: tuple[NodeRecord, ...]
    shapes: frozenset[tuple[int, int, int]]
    total_cpu: int
    total_memory: int
    total_gpus: int

    @classmethod
    def of(cls, nodes: Iterable[NodeRecord]) -> Fleet:
        ready = tuple(n for n in nodes if n.schedulable)
        return cls(
            ready,
            frozenset((n.cpu_milli, n.memory_bytes, len(n.gpus)) for n in ready),
            sum(n.cpu_milli for n in ready),
            sum(n.memory_bytes for n in ready),
            sum(len(n.gpus) for n in ready),
        )


class FleetCache:
    """FleetCache: the Fleet of `nodes()`, built again when their count changes or FLEET_AGE_S
    passed (a cordon or a disconnection shows within that)."""

    def __init__(
        self,
        nodes: Callable[[], Sequence[NodeRecord]],
        count: Callable[[], int],
        clock: Callable[[], float],
    ) -> None:
        self._nodes, self._count, self._clock = nodes, count, clock
        self._fleet: Fleet | None = None
        self._key = (-1, 0.0)

    def fleet(self) -> Fleet:
        count, now = self._count(), self._clock()
        if self._fleet is None or count != self._key[0] or now - self._key[1] > FLEET_AGE_S:
            self._fleet, self._key = Fleet.of(self._nodes()), (count, now)
        return self._fleet


def capacity_warnings(spec: JobSpec, nodes: Fleet | Iterable[NodeRecord]) -> list[str]:
    """capacity_warnings: why `spec` cannot run on these nodes as they are, one reason a line
    (empty: nothing found that rules it out)."""
    fleet = nodes if isinstance(nodes, Fleet) else Fleet.of(nodes)
    if not fleet.nodes:
        return ["no Ready, schedulable node has joined yet; the job waits for one"]
    warnings = [
        problem
        for who, template in [
            ("the leader", spec.leader),
            *((f"each worker of {ws.name}", ws.template) for ws in spec.worker_sets),
        ]
        if (problem := _pod_problem(who, template, fleet))
    ]
    if warnings:
        return warnings  # a pod no node can hold already rules the job out
    total = _minimum_problem(spec, fleet)
    return [total] if total else []


def _pod_problem(who: str, template: PodTemplate, fleet: Fleet) -> str:
    """_pod_problem: why no single Ready node could hold one pod of `template`, or ""."""
    res = template.resources
    if not (template.node_selector or template.image or res.gpu_type):
        return _shape_problem(who, res.cpu_milli, res.memory_bytes, res.gpu_milli, fleet.shapes)
    nodes = [
        n
        for n in fleet.nodes
        if all(n.labels.get(k) == v for k, v in template.node_selector.items())
    ]
    if not nodes:
        labels = ",".join(f"{k}={v}" for k, v in sorted(template.node_selector.items()))
        return f"{who} needs nodeSelector {labels}; no Ready node has those labels"
    if template.image:
        nodes = [n for n in nodes if n.runs_images]
        if not nodes:
            return f"{who} runs image {template.image}; no Ready node has a container runtime"
    models = frozenset(m for m in res.gpu_type.split("|") if m)
    shapes = frozenset(
        (n.cpu_milli, n.memory_bytes, sum(1 for g in n.gpus if not models or g.model in models))
        for n in nodes
    )
    kind = f"{'/'.join(sorted(models))} " if models else ""
    return _shape_problem(who, res.cpu_milli, res.memory_bytes, res.gpu_milli, shapes, kind)


def _shape_problem(
    who: str,
    cpu: int,
    memory: int,
    gpu_milli: int,
    shapes: frozenset[tuple[int, int, int]],
    kind: str = "",
) -> str:
    """_shape_problem: why no node of these (cores, memory, GPUs of the wanted kind) shapes
    could hold a pod of this request, or ""."""
    gpus_wanted = max(1, gpu_milli // GPU_MILLI) if gpu_milli else 0
    checks = (
        ("CPU", cpu, max(c for c, _, _ in shapes), _cores),
        ("memory", memory, max(m for _, m, _ in shapes), format_memory),
        (f"{kind}GPU", gpus_wanted, max(g for _, _, g in shapes), str),
    )
    for name, wanted, largest, shown in checks:
        if wanted > largest:
            if name == "memory":
                return (
                    f"{who} needs {shown(wanted)} of memory; the largest node has {shown(largest)}"
                )
            return (
                f"{who} needs {_count(shown(wanted), name)}; the largest node has {shown(largest)}"
            )
    if not any(c >= cpu and m >= memory and g >= gpus_wanted for c, m, g in shapes):
        need = f"{_count(_cores(cpu), 'CPU')}, {format_memory(memory)} of memory"
        if gpus_wanted:
            need += f" and {_count(str(gpus_wanted), kind + 'GPU')}"
        return f"{who} needs {need} on one node; no Ready node has all of them"
    return ""


def _minimum_problem(spec: JobSpec, fleet: Fleet) -> str:
    """_minimum_problem: why the gang minimum (the leader and the workers it cannot start
    without) exceeds every Ready node together, or ""."""
    ranks = spec.minimum_ranks()
    everyone = spec.basic_policy == BasicPolicy.GANG
    pods = [spec.leader] + [
        slot.template for slot in spec.pod_slots()[1:] if everyone or slot.rank in ranks
    ]
    if len(pods) == 1:
        return ""  # the leader alone: its own check covers it
    count = len(fleet.nodes)
    where = f"on {count} Ready node{'s' if count != 1 else ''}"
    cpu = sum(t.resources.cpu_milli for t in pods)
    have_cpu = fleet.total_cpu
    gang = f"the gang minimum ({len(pods)} pods)"
    if cpu > have_cpu:
        return f"{gang} needs {_cores(cpu)} CPUs; the cluster has {_cores(have_cpu)} in all {where}"
    memory = sum(t.resources.memory_bytes for t in pods)
    have_memory = fleet.total_memory
    if memory > have_memory:
        return (
            f"{gang} needs {format_memory(memory)} of memory; the cluster has "
            f"{format_memory(have_memory)} in all {where}"
        )
    gpu = sum(t.resources.gpu_milli for t in pods) / GPU_MILLI
    have_gpu = fleet.total_gpus
    if gpu > have_gpu:
        return f"{gang} needs {gpu:g} GPUs; the cluster has {have_gpu} in all {where}"
    return ""


def _cores(milli: int) -> str:
    return f"{milli / 1000:g}"


def _count(shown: str, name: str) -> str:
    return f"{shown} {name}{'' if shown == '1' else 's'}"
