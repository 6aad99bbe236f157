"""framework: the registries of actions and plugins, and the shapes of the callbacks plugins
register on a session (as Volcano's session does: AddJobOrderFn, AddPredicateFn, ...).

Actions decide what happens in what order and contain no policy; plugins are policy and never
loop over jobs: they answer for one job, pod or queue at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from arranger.sched.nodes import BoolArray, FloatArray, Index, NodeArrays
from arranger.sched.plan import GpuShare
from arranger.sched.resources import Res
from arranger.sched.snapshot import JobInfo, PodRequest

if TYPE_CHECKING:
    from arranger.sched.session import QueueState, Session

JobKey = Callable[[JobInfo], float]
QueueKey = Callable[["QueueState"], float]
Scorer = Callable[[PodRequest, JobInfo, Index], FloatArray]
Admission = Callable[[JobInfo, Res], str | None]
AllocateHook = Callable[[JobInfo, Res, int, int], None]  # job, request, node, +1 or -1
# Preemptable: may the first job evict pods of the second? None if so, else the reason why not
# (a constant of reasons). Evictable: ... and this much more of them, now?
Preemptable = Callable[[JobInfo, JobInfo], str | None]
Evictable = Callable[[JobInfo, JobInfo, Res], str | None]
Minimum = Callable[[JobInfo], list[PodRequest]]
# ClaimCheck: may the job (its minimum placed) keep room being freed for others? None if so.
# With `before` (its queue's allocation before it evicted anything), only growth counts.
ClaimCheck = Callable[[JobInfo, Res | None], str | None]
Action = Callable[["Session"], None]
# Which GPUs of a node a pod gets (None: the node cannot give them); plugins may replace it.
GpuChooser = Callable[[NodeArrays, int, PodRequest], "tuple[GpuShare, ...] | None"]


@dataclass(frozen=True)
class NodeFilter:
    """NodeFilter is a feasibility check that depends on the pod's shape, not on usage.

    `mask(pod, job)` says which nodes pass; its result is cached per `key(pod, job)`, so a
    worker set of a thousand identical pods computes it once. `reason` names the failure in
    messages ("{gpu_type}" is filled from the pod). A `transient` filter depends on the
    node's state now (cordoned, disconnected, reserved), not on what the node is: it is left
    out when asking whether a job could ever fit.
    """

    name: str
    reason: str
    mask: Callable[[PodRequest, JobInfo], BoolArray]
    key: Callable[[PodRequest, JobInfo], Hashable]
    transient: bool = False


class Plugin:
    """Plugin registers its callbacks on the session in `open`; one instance per cycle."""

    name: ClassVar[str]

    def __init__(self, session: Session) -> None:
        self.session = session

    def open(self) -> None:
        raise NotImplementedError


# PLUGINS is the production registry: the core's plugins only. A session looks its plugins up
# in Session.registry, which is this; a session of its own (the simulator's) may add others
# to a view of it without adding them here.
PLUGINS: dict[str, type[Plugin]] = {}
ACTIONS: dict[str, Action] = {}


def plugin(cls: type[Plugin]) -> type[Plugin]:
    """plugin registers a Plugin class under its name."""
    PLUGINS[cls.name] = cls
    return cls


def action(name: str) -> Callable[[Action], Action]:
    """action registers a function as the action of that name."""

    def register(fn: Action) -> Action:
        ACTIONS[name] = fn
        return fn

    return register
