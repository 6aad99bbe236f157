"""plan is what a scheduling cycle decides: placements and each job's schedule state."""

from __future__ import annotations

from dataclasses import dataclass, field

from arranger.sched.resources import Res
from arranger.states import ScheduleState


@dataclass(frozen=True, slots=True)
class GpuShare:
    """GpuShare is `milli` thousandths of GPU `index` on the pod's node (1000: the whole GPU)."""

    index: int
    milli: int


@dataclass(frozen=True, slots=True)
class Placement:
    job_id: str
    pod: str
    node: str
    gpus: tuple[GpuShare, ...] = ()


@dataclass(frozen=True, slots=True)
class JobDecision:
    """JobDecision is a job's schedule state after the cycle and, when not all placed, why.

    `infeasible` says the job's minimum does not fit even the empty cluster of schedulable nodes.
    """

    job_id: str
    state: ScheduleState
    reason: str = ""
    message: str = ""
    infeasible: bool = False


@dataclass(slots=True)
class Plan:
    """Plan is the output of one cycle; placements are in the order they were decided; each job
    of the snapshot has a decision; `deserved` is each queue's share this cycle."""

    placements: list[Placement] = field(default_factory=list)
    decisions: dict[str, JobDecision] = field(default_factory=dict)
    deserved: dict[str, Res] = field(default_factory=dict)  # each queue's fair share
