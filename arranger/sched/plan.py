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


@dataclass(frozen=True, slots=True)
class Reservation:
    """Reservation: nodes locked for one starving job; they take no new pods of other jobs."""

    job_id: str
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Claim:
    """Claim: room being freed for `job_id` by evicting `victims` ((job id, pod) pairs). A
    plan carries it into the next snapshot while the victims stop (under notice, or in their
    grace) and the job's minimum waits: the job then has the first go at the room in allocate
    and in preempt's view, so another job does not take it and send it evicting again."""

    job_id: str
    victims: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Eviction:
    """Eviction stops a running pod so that `for_job` can be placed; the pod runs again later
    (a worker returns to Pending; a whole job evicted returns to Pending) and no restart is
    counted. `reason` says who took it and why. `in_minimum`: whether the pod was in its job's
    gang minimum when chosen (so the whole job goes), None when not known."""

    job_id: str
    pod: str
    node: str
    for_job: str
    reason: str
    in_minimum: bool | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    """Refusal: `action` (preempt or reclaim) was tried for the job's minimum and evicted
    nothing; `reason` is a constant of reasons (the one that refused the most victims, or the
    job-wide one), `message` counts the victims refused for each reason, in words."""

    job_id: str
    action: str
    reason: str
    message: str


@dataclass(slots=True)
class Plan:
    """Plan is the output of one cycle: placements in the order they were decided, a decision
    for each job with pods to place, each queue's deserved share, the pods to evict, and the
    reservation and the claims that stand after the cycle (carried into the next snapshot),
    and why preempt or reclaim evicted nothing for jobs whose minimum waits."""

    placements: list[Placement] = field(default_factory=list)
    decisions: dict[str, JobDecision] = field(default_factory=dict)
    deserved: dict[str, Res] = field(default_factory=dict)  # each queue's fair share
    evictions: list[Eviction] = field(default_factory=list)
    reservation: Reservation | None = None
    claims: list[Claim] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    # The earliest time after the snapshot's at which time alone could change a decision of
    # this plan (a starvation threshold, an infeasible or schedule timeout; the snapshot's time
    # itself while a reservation still grows); None: only a change of the cluster can.
    wake_at: float | None = None
