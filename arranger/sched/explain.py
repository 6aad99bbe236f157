"""explain answers, for one job, why it is where it is: pure, like the cycle it mirrors.

It runs the same cycle the scheduler would on the snapshot, then reads off: the job's place
in its queue's order and the first jobs ahead of it there, the queue's shares, for each pod shape of its gang minimum how many
nodes fit and why the others do not (on the cluster as it is, before this cycle's
placements, with the minimum's earlier pods placed as the cycle places them), whether it holds or is kept out by a reservation, what it could preempt or why preempt and reclaim evict nothing for it, and,
when it can be derived, when it should start: the moment enough running jobs have reached
their maxRuntimeSeconds for its minimum to fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from arranger.sched.actions.preempt import evict_for
from arranger.sched.cluster import Snapshot
from arranger.sched.config import SchedulerConfig
from arranger.sched.cycle import run_cycle
from arranger.sched.placement import (
    groups,
    misfit_counts,
    ordered,
    place_all_or_nothing,
    place_group,
)
from arranger.sched.plan import Eviction, Refusal
from arranger.sched.resources import Res
from arranger.sched.session import Session
from arranger.sched.snapshot import JobInfo, PodRequest, RunningPod
from arranger.sched.statement import Statement

AHEAD_SHOWN = 5  # names of the jobs ahead of one in its queue that an explanation lists


@dataclass(frozen=True)
class PodFit:
    """PodFit: for one pod shape of the minimum, the nodes that would take it now and, for
    the others, the first filter each fails."""

    pod: str
    count: int
    fitting_nodes: int
    reasons: tuple[tuple[str, int], ...]
    total_nodes: int  # the nodes counted: fitting_nodes and the reasons' counts add up to it


@dataclass(frozen=True)
class Victim:
    """Victim: a job preempt (or reclaim) would take pods of for this one, and why it is needed:
    what its pods free, and where the minimum's pods would then go."""

    job: str
    pods: int
    why: str


@dataclass
class Explanation:
    job_id: str
    placed: bool = False
    decision: str = ""
    message: str = ""
    queue: str = ""
    position: int = 0  # 1-based, among the jobs of its queue still waiting
    waiting_in_queue: int = 0
    ahead: list[str] = field(default_factory=list)  # the first AHEAD_SHOWN ahead, in order
    ahead_more: int = 0  # how many more are ahead
    queue_allocated: Res = Res()
    queue_deserved: Res = Res()
    queue_capability: Res | None = None
    fits: list[PodFit] = field(default_factory=list)
    reservation: str = ""
    preemptable: list[Victim] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)  # why preempt/reclaim evict nothing
    estimated_start: float | None = None


def explain(snapshot: Snapshot, config: SchedulerConfig, job_id: str) -> Explanation | None:
    """explain returns the explanation of one job of the snapshot, or None if it is not in it."""
    job = next((j for j in snapshot.jobs if j.id == job_id), None)
    if job is None:
        return None
    result = Explanation(job_id, queue=job.queue)
    plan = run_cycle(snapshot, config)
    decision = plan.decisions.get(job_id)
    if decision is not None:
        result.decision, result.message = decision.state.value, decision.message
    result.placed = any(p.job_id == job_id for p in plan.placements)
    result.refused = [r for r in plan.refusals if r.job_id == job_id]
    session = Session(snapshot, config)  # the cluster as it is, before this cycle's placements
    queue = session.queue_of(job)
    result.queue_allocated, result.queue_capability = queue.allocated, queue.info.capability
    result.queue_deserved = plan.deserved.get(job.queue, Res())
    waiting = sorted(
        (j for j in snapshot.jobs if j.queue == job.queue and any(p.in_minimum for p in j.pending)),
        key=session.job_key,
    )
    result.waiting_in_queue = len(waiting)
    result.position = next((i + 1 for i, j in enumerate(waiting) if j.id == job_id), 0)
    if result.position:
        before = waiting[: result.position - 1]
        result.ahead = [j.name for j in before[:AHEAD_SHOWN]]
        result.ahead_more = len(before) - len(result.ahead)
    minimum = session.minimum(job)
    result.fits = _fits(session, job, minimum)
    result.reservation = _reservation(snapshot, job)
    if minimum and not result.placed:
        result.preemptable = _preemptable(snapshot, config, job)
        result.estimated_start = _estimated_start(snapshot, config, job)
    return result


def _fits(session: Session, job: JobInfo, minimum: list[PodRequest]) -> list[PodFit]:
    """_fits: for each group of the minimum, the nodes that take its first pod once the groups
    before it are placed, as the cycle places a gang and counts the pod it finds no node for:
    one count per pod, the same in an explanation's fits as in the cycle's message."""
    fits = []
    statement = Statement(session)
    try:
        for group in groups(ordered(minimum)):
            counts = misfit_counts(session, statement.nodes, group[0], job)
            fitting = len(statement.nodes) - sum(counts.values())
            reasons = tuple((r, n) for r, n in counts.items() if n)
            total = len(statement.nodes)
            fits.append(PodFit(group[0].name, len(group), fitting, reasons, total))
            place_group(session, statement, job, group)
    finally:
        statement.discard()
    return fits


def _reservation(snapshot: Snapshot, job: JobInfo) -> str:
    reservation = snapshot.reservation
    if reservation is None:
        return ""
    nodes = len(reservation.nodes)
    if reservation.job_id == job.id:
        return f"holds a reservation of {nodes} nodes against starvation"
    target = next((j.name for j in snapshot.jobs if j.id == reservation.job_id), reservation.job_id)
    return f"{nodes} nodes are reserved for starving job {target}; it cannot use them"


def _preemptable(snapshot: Snapshot, config: SchedulerConfig, job: JobInfo) -> list[Victim]:
    """_preemptable: the victims preempt (or reclaim) would choose for this job now, each with
    why it is needed: none of them can be spared (see victims.minimal), and each frees room on
    nodes the minimum's pods would then use, or room in its queue's capability."""
    session = Session(snapshot, config)
    session.progress[job.id].admitted = True
    scratch: list[Statement] = []
    try:
        for reclaim in (False, True):
            evict_for(session, job, reclaim, scratch)
            if session.plan.evictions:
                break
        used = {node for claim in session.holds for node in claim.nodes_used()}
    finally:
        session.release_claims()
        for statement in reversed(scratch):
            statement.discard()
    names = {j.id: j.name for j in snapshot.jobs}
    taken: dict[str, list[Eviction]] = {}
    for eviction in session.plan.evictions:
        taken.setdefault(eviction.job_id, []).append(eviction)
    index, requests = session.nodes.index, _requests(snapshot)
    victims = []
    for job_id, evictions in sorted(taken.items(), key=lambda item: names[item[0]]):
        freed = Res.total(requests[(job_id, e.pod)] for e in evictions)
        nodes = sorted({e.node for e in evictions if index.get(e.node) in used})
        whole = " (its minimum: the whole job)" if any(e.in_minimum for e in evictions) else ""
        where = (
            f"on {', '.join(nodes)}, where the minimum's pods go"
            if nodes
            else "of its queue's capability, which the minimum needs"
        )
        why = f"frees {_amount(freed)} {where}{whole}"
        victims.append(Victim(names[job_id], len(evictions), why))
    return victims


def _requests(snapshot: Snapshot) -> dict[tuple[str, str], RunningPod]:
    return {(j.id, p.name): p for j in snapshot.jobs for p in j.running}


def _amount(res: Res) -> str:
    """_amount: a request in words: '2 cpu, 8Gi memory, 1 gpu'."""
    parts = [f"{res.cpu_milli / 1000:g} cpu", f"{res.memory_bytes / 2**30:g}Gi memory"]
    if res.gpu_milli:
        parts.append(f"{res.gpu_milli / 1000:g} gpu")
    return ", ".join(parts)


def _estimated_start(snapshot: Snapshot, config: SchedulerConfig, job: JobInfo) -> float | None:
    """_estimated_start: release running jobs in the order their maxRuntimeSeconds run out,
    until the job's minimum fits; None when no such order gets there."""
    session = Session(snapshot, config)
    minimum = session.minimum(job)
    ends = sorted(
        (
            (j.start_time + j.max_runtime_s, j)
            for j in snapshot.jobs
            if j.id != job.id
            and j.running
            and j.start_time is not None
            and j.max_runtime_s is not None
        ),
        key=lambda end_job: (end_job[0], end_job[1].id),
    )
    what_if = Statement(session)
    try:
        for end, other in ends:
            for pod in other.running:
                if pod.node in session.nodes.index:
                    what_if.release(other, pod)
            statement, misfit = place_all_or_nothing(session, job, minimum)
            statement.discard()
            if misfit is None:
                return max(end, snapshot.now)
        return None
    finally:
        what_if.discard()
