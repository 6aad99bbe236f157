"""fit says, when a job is submitted, why it cannot run on the cluster as it is now, so the
user learns at once rather than from a job that waits forever; the job is queued all the same
(nodes may join).

It compares the job with the capacity of the Ready, schedulable nodes, not their free room: a
pod whose request no single node could hold however empty (honouring its nodeSelector, GPU
type and container image), and a gang minimum larger than all of them together. One pass over
the nodes per pod template: O(nodes), no scheduling cycle. It never warns of a job that could
fit; some that cannot (a queue's machine groups, a scarce GPU type) pass without a warning.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from arranger.quantity import format_memory
from arranger.server.model import NodeRecord
from arranger.spec import JobSpec, PodTemplate
from arranger.states import BasicPolicy

GPU_MILLI = 1000


def capacity_warnings(spec: JobSpec, nodes: Iterable[NodeRecord]) -> list[str]:
    """capacity_warnings: why `spec` cannot run on these nodes as they are, one reason a line
    (empty: nothing found that rules it out)."""
    ready = [n for n in nodes if n.schedulable]
    if not ready:
        return ["no Ready, schedulable node has joined yet; the job waits for one"]
    warnings = [
        problem
        for who, template in [
            ("the leader", spec.leader),
            *((f"each worker of {ws.name}", ws.template) for ws in spec.worker_sets),
        ]
        if (problem := _pod_problem(who, template, ready))
    ]
    if warnings:
        return warnings  # a pod no node can hold already rules the job out
    total = _minimum_problem(spec, ready)
    return [total] if total else []


def _pod_problem(who: str, template: PodTemplate, ready: Sequence[NodeRecord]) -> str:
    """_pod_problem: why no single Ready node could hold one pod of `template`, or ""."""
    res = template.resources
    nodes = [
        n for n in ready if all(n.labels.get(k) == v for k, v in template.node_selector.items())
    ]
    if not nodes:
        labels = ",".join(f"{k}={v}" for k, v in sorted(template.node_selector.items()))
        return f"{who} needs nodeSelector {labels}; no Ready node has those labels"
    if template.image:
        nodes = [n for n in nodes if n.runs_images]
        if not nodes:
            return f"{who} runs image {template.image}; no Ready node has a container runtime"
    models = frozenset(m for m in res.gpu_type.split("|") if m)
    kind = f"{'/'.join(sorted(models))} " if models else ""
    gpus_wanted = max(1, res.gpu_milli // GPU_MILLI) if res.gpu_milli else 0

    def gpus(node: NodeRecord) -> int:
        return sum(1 for g in node.gpus if not models or g.model in models)

    checks = (
        ("CPU", res.cpu_milli, max(n.cpu_milli for n in nodes), _cores),
        ("memory", res.memory_bytes, max(n.memory_bytes for n in nodes), format_memory),
        (f"{kind}GPU", gpus_wanted, max(gpus(n) for n in nodes), str),
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
    if not any(
        n.cpu_milli >= res.cpu_milli
        and n.memory_bytes >= res.memory_bytes
        and gpus(n) >= gpus_wanted
        for n in nodes
    ):
        need = (
            f"{_count(_cores(res.cpu_milli), 'CPU')}, {format_memory(res.memory_bytes)} of memory"
        )
        if gpus_wanted:
            need += f" and {_count(str(gpus_wanted), kind + 'GPU')}"
        return f"{who} needs {need} on one node; no Ready node has all of them"
    return ""


def _minimum_problem(spec: JobSpec, ready: Sequence[NodeRecord]) -> str:
    """_minimum_problem: why the gang minimum (the leader and the workers it cannot start
    without) exceeds every Ready node together, or ""."""
    ranks = spec.minimum_ranks()
    everyone = spec.basic_policy == BasicPolicy.GANG
    pods = [spec.leader] + [
        slot.template for slot in spec.pod_slots()[1:] if everyone or slot.rank in ranks
    ]
    if len(pods) == 1:
        return ""  # the leader alone: its own check covers it
    where = f"on {len(ready)} Ready node{'s' if len(ready) != 1 else ''}"
    cpu = sum(t.resources.cpu_milli for t in pods)
    have_cpu = sum(n.cpu_milli for n in ready)
    gang = f"the gang minimum ({len(pods)} pods)"
    if cpu > have_cpu:
        return f"{gang} needs {_cores(cpu)} CPUs; the cluster has {_cores(have_cpu)} in all {where}"
    memory = sum(t.resources.memory_bytes for t in pods)
    have_memory = sum(n.memory_bytes for n in ready)
    if memory > have_memory:
        return (
            f"{gang} needs {format_memory(memory)} of memory; the cluster has "
            f"{format_memory(have_memory)} in all {where}"
        )
    gpu = sum(t.resources.gpu_milli for t in pods) / GPU_MILLI
    have_gpu = sum(len(n.gpus) for n in ready)
    if gpu > have_gpu:
        return f"{gang} needs {gpu:g} GPUs; the cluster has {have_gpu} in all {where}"
    return ""


def _cores(milli: int) -> str:
    return f"{milli / 1000:g}"


def _count(shown: str, name: str) -> str:
    return f"{shown} {name}{'' if shown == '1' else 's'}"
