"""fit says, when a job is submitted, why it cannot run on the cluster: as it is now (a
warning; the job is queued all the same, nodes may join), or ever (admission refuses it).

A warning compares the job with the capacity of the Ready, schedulable nodes, not their free
room: a pod whose request no single node could hold however empty (honouring its nodeSelector,
GPU type and container image), and a gang minimum larger than all of them together. It names
every short resource with the numbers. It never warns of a job that could fit; some that
cannot (a queue's machine groups, a scarce GPU type) pass without a warning.

The same checks against every registered node, whatever its state (NotReady, cordoned or
disconnected nodes counted as if Ready and empty), say whether a job could never fit: as Slurm
refuses a job no node of its partition could ever satisfy, whatever the nodes' state.

A submit must not cost a pass over every node: the nodes are summed up once in a Fleet (their
largest and total sizes, and the distinct node shapes, few in any real cluster), which the
server reuses until the node count changes or FLEET_AGE_S passes. A pod template with a
nodeSelector, GPU type or image filters the Fleet's nodes once; the shapes found are kept in
the Fleet for the next submit that asks the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from arranger.quantity import format_memory
from arranger.server.model import NodeRecord
from arranger.spec import JobSpec, PodTemplate
from arranger.states import BasicPolicy

GPU_MILLI = 1000
# How long a Fleet answers for nodes whose count has not changed: summing 5,000 nodes up takes
# about 17 ms, which once a second cost each of 100 submits a second 0.17 ms.
FLEET_AGE_S = 5.0
KINDS_KEPT = 1024  # the placement kinds whose node shapes a Fleet keeps

Shapes = frozenset[tuple[int, int, int]]
# A kind of pod placement: its nodeSelector (sorted items), GPU models, whether it runs an image.
Kind = tuple[tuple[tuple[str, str], ...], frozenset[str], bool]


@dataclass(frozen=True)
class Fleet:
    """Fleet: the nodes counted (`which`: "Ready" for the Ready, schedulable ones, or
    "registered" for all), their total sizes and their distinct (cores, memory, GPUs) shapes;
    `kinds` keeps the shapes of the nodes each kind of placement may use, once asked."""

    nodes: tuple[NodeRecord, ...]
    shapes: Shapes
    total_cpu: int
    total_memory: int
    total_gpus: int
    which: str = "Ready"
    kinds: dict[Kind, Shapes] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, nodes: Iterable[NodeRecord], ready: bool = True) -> Fleet:
        counted = tuple(n for n in nodes if n.schedulable or not ready)
        return cls(
            counted,
            frozenset((n.cpu_milli, n.memory_bytes, len(n.gpus)) for n in counted),
            sum(n.cpu_milli for n in counted),
            sum(n.memory_bytes for n in counted),
            sum(len(n.gpus) for n in counted),
            "Ready" if ready else "registered",
        )

    def shapes_for(self, kind: Kind) -> Shapes:
        """shapes_for: the shapes of the nodes a placement of `kind` may use (GPUs counted of
        its models only), found once per Fleet."""
        found = self.kinds.get(kind)
        if found is None:
            selector, models, image = kind
            found = frozenset(
                (
                    n.cpu_milli,
                    n.memory_bytes,
                    sum(1 for g in n.gpus if not models or g.model in models),
                )
                for n in self.nodes
                if all(n.labels.get(k) == v for k, v in selector) and (n.runs_images or not image)
            )
            if len(self.kinds) >= KINDS_KEPT:  # user-chosen selectors: the oldest goes
                del self.kinds[next(iter(self.kinds))]
            self.kinds[kind] = found
        return found


class FleetCache:
    """FleetCache: the Fleets of `nodes()` (Ready, and registered), built again when their
    count changes or FLEET_AGE_S passed (a cordon or a disconnection shows within that)."""

    def __init__(
        self,
        nodes: Callable[[], Sequence[NodeRecord]],
        count: Callable[[], int],
        clock: Callable[[], float],
    ) -> None:
        self._nodes, self._count, self._clock = nodes, count, clock
        self._fleets: tuple[Fleet, Fleet] | None = None
        self._key = (-1, 0.0)

    def _both(self, fresh: bool = False) -> tuple[Fleet, Fleet]:
        count, now = self._count(), self._clock()
        fleets = self._fleets
        if fleets is None or fresh or count != self._key[0] or now - self._key[1] > FLEET_AGE_S:
            nodes = self._nodes()
            fleets = (Fleet.of(nodes), Fleet.of(nodes, ready=False))
            self._fleets, self._key = fleets, (count, now)
        return fleets

    def fleet(self) -> Fleet:
        """fleet: the Ready, schedulable nodes' Fleet."""
        return self._both()[0]

    def registered(self, fresh: bool = False) -> Fleet:
        """registered: every registered node's Fleet, whatever its state; `fresh`: built now
        (a node that registered again bigger, or with other labels, counts at once)."""
        return self._both(fresh)[1]


@dataclass(frozen=True)
class Shortfall:
    """Shortfall: why a part of a job cannot fit; `path` is the spec's field it comes from."""

    path: str
    text: str


def capacity_warnings(spec: JobSpec, nodes: Fleet | Iterable[NodeRecord]) -> list[str]:
    """capacity_warnings: why `spec` cannot run on these nodes as they are, one reason a line
    (empty: nothing found that rules it out)."""
    fleet = nodes if isinstance(nodes, Fleet) else Fleet.of(nodes)
    if not fleet.nodes:
        return ["no Ready, schedulable node has joined yet; the job waits for one"]
    return [s.text for s in shortfalls(spec, fleet)]


def never_fits(spec: JobSpec, registered: Fleet) -> list[Shortfall]:
    """never_fits: why `spec` could not run even on every registered node, all of them Ready
    and empty; nothing when none has registered (a cluster starting up)."""
    return shortfalls(spec, registered) if registered.nodes else []


def shortfalls(spec: JobSpec, fleet: Fleet) -> list[Shortfall]:
    """shortfalls: each pod template no single node of `fleet` could hold; when there is none,
    a gang minimum larger than all of them together."""
    parts = [
        ("the leader", "spec.leader.template", spec.leader),
        *(
            (f"each worker of {ws.name}", f"spec.workerSets[{i}].template", ws.template)
            for i, ws in enumerate(spec.worker_sets)
        ),
    ]
    found = [
        Shortfall(path, problem)
        for who, path, template in parts
        if (problem := _pod_problem(who, template, fleet))
    ]
    if found:
        return found  # a pod no node can hold already rules the job out
    total = _minimum_problem(spec, fleet)
    return [Shortfall("spec.workerSets", total)] if total else []


def _pod_problem(who: str, template: PodTemplate, fleet: Fleet) -> str:
    """_pod_problem: why no single node of `fleet` could hold one pod of `template`, or ""."""
    res = template.resources
    models = frozenset(m for m in res.gpu_type.split("|") if m)
    selector = tuple(sorted(template.node_selector.items()))
    where = f"{fleet.which} node"
    if not (selector or template.image or models):
        return _shape_problem(
            who, res.cpu_milli, res.memory_bytes, res.gpu_milli, fleet.shapes, where
        )
    if selector and not fleet.shapes_for((selector, frozenset(), False)):
        labels = ",".join(f"{k}={v}" for k, v in selector)
        return f"{who} needs nodeSelector {labels}; no {where} has those labels"
    shapes = fleet.shapes_for((selector, models, bool(template.image)))
    if not shapes:
        return f"{who} runs image {template.image}; no {where} has a container runtime"
    kind = f"{'/'.join(sorted(models))} " if models else ""
    return _shape_problem(who, res.cpu_milli, res.memory_bytes, res.gpu_milli, shapes, where, kind)


def _shape_problem(
    who: str, cpu: int, memory: int, gpu_milli: int, shapes: Shapes, where: str, kind: str = ""
) -> str:
    """_shape_problem: why no node of these (cores, memory, GPUs of the wanted kind) shapes
    could hold a pod of this request, naming every resource short on all of them, or ""."""
    gpus_wanted = max(1, gpu_milli // GPU_MILLI) if gpu_milli else 0
    largest = [max(shape[i] for shape in shapes) for i in range(3)]
    checks = (
        (cpu, _count(_cores(cpu), "CPU"), _count(_cores(largest[0]), "CPU")),
        (memory, f"{format_memory(memory)} of memory", format_memory(largest[1])),
        (
            gpus_wanted,
            _count(str(gpus_wanted), kind + "GPU"),
            _count(str(largest[2]), kind + "GPU"),
        ),
    )
    short = [
        f"{wanted} (the largest node has {has})"
        for (amount, wanted, has), most in zip(checks, largest, strict=True)
        if amount > most
    ]
    if short:
        return f"{who} needs {_listed(short)}"
    if not any(c >= cpu and m >= memory and g >= gpus_wanted for c, m, g in shapes):
        need = [_count(_cores(cpu), "CPU"), f"{format_memory(memory)} of memory"]
        if gpus_wanted:
            need.append(_count(str(gpus_wanted), kind + "GPU"))
        return f"{who} needs {_listed(need)} on one node; no {where} has all of them"
    return ""


def _minimum_problem(spec: JobSpec, fleet: Fleet) -> str:
    """_minimum_problem: why the gang minimum (the leader and the workers it cannot start
    without) exceeds every node of `fleet` together, naming every resource short, or ""."""
    ranks = spec.minimum_ranks()
    everyone = spec.basic_policy == BasicPolicy.GANG
    pods = [spec.leader] + [
        slot.template for slot in spec.pod_slots()[1:] if everyone or slot.rank in ranks
    ]
    if len(pods) == 1:
        return ""  # the leader alone: its own check covers it
    count = len(fleet.nodes)
    where = f"on {count} {fleet.which} node{'s' if count != 1 else ''}"
    cpu = sum(t.resources.cpu_milli for t in pods)
    memory = sum(t.resources.memory_bytes for t in pods)
    gpu = sum(t.resources.gpu_milli for t in pods) / GPU_MILLI
    short = [
        f"{wanted} (the cluster has {have} in all)"
        for wanted, have, over in (
            (f"{_cores(cpu)} CPUs", _cores(fleet.total_cpu), cpu > fleet.total_cpu),
            (
                f"{format_memory(memory)} of memory",
                format_memory(fleet.total_memory),
                memory > fleet.total_memory,
            ),
            (f"{gpu:g} GPUs", str(fleet.total_gpus), gpu > fleet.total_gpus),
        )
        if over
    ]
    if not short:
        return ""
    return f"the gang minimum ({len(pods)} pods) needs {_listed(short)} {where}"


def _listed(items: list[str]) -> str:
    """_listed: 'a', 'a and b', 'a, b and c'."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _cores(milli: int) -> str:
    return f"{milli / 1000:g}"


def _count(shown: str, name: str) -> str:
    return f"{shown} {name}{'' if shown == '1' else 's'}"
