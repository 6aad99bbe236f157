"""plan_apply: the scheduler's plan carried out on the controller's records (DESIGN §3).

Placed pods are bound to their nodes (those that changed since the snapshot was taken are left
for the next cycle, as are all the pods of the jobs the plan re-check skips); evictions are
carried out or noticed (arranger.server.evictions); the reservation and the claims are kept
for the next snapshot, and notices given for claims that no longer stand are withdrawn; each
job's schedule state, reason and message are recorded. Every job changed is then reconciled.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Protocol

from arranger.sched import Plan
from arranger.sched.plan import Claim, Reservation
from arranger.server import evictions
from arranger.server.effects import Effects
from arranger.server.evictions import EvictionSteps
from arranger.server.model import JobRecord, NodeRecord
from arranger.states import PodState, ScheduleState, Stage


class PlanSteps(EvictionSteps, Protocol):
    """PlanSteps: what applying a plan takes of the controller: its records, the reservation
    and claims it keeps between cycles, and reconciling a job."""

    reservation: Reservation | None
    claims: tuple[Claim, ...]

    @property
    def jobs(self) -> Mapping[str, JobRecord]: ...

    @property
    def nodes(self) -> Mapping[str, NodeRecord]: ...

    @property
    def placed_on(self) -> dict[str, set[str]]: ...

    def reconcile(self, job: JobRecord, now: float, fx: Effects) -> None: ...


def apply_plan(steps: PlanSteps, plan: Plan, now: float, skip: Collection[str] = ()) -> Effects:
    """apply_plan binds placed pods and records each job's schedule state (skipping pods
    that changed since the snapshot, and all of the jobs in `skip`); notices given for
    claims that no longer stand are withdrawn."""
    fx = Effects()
    jobs, nodes = steps.jobs, steps.nodes
    touched: dict[str, JobRecord] = {}
    for placement in plan.placements:
        if placement.job_id in skip:
            continue
        job = jobs.get(placement.job_id)
        pod = job.pods.get(placement.pod) if job else None
        node = nodes.get(placement.node)
        if job is None or pod is None or node is None or not job.active:
            continue
        if pod.state != PodState.PENDING or pod.done:
            continue
        pod.state, pod.node, pod.gpus = PodState.PLACED, node.name, placement.gpus
        steps.placed_on.setdefault(node.name, set()).add(job.id)
        fx.pods.add(pod.uid)
        touched[job.id] = job
    evictions.evict(steps, jobs, plan.evictions, now, fx, touched)
    _reserve(steps, plan.reservation, now, fx)
    evictions.withdraw(jobs, steps.claims, tuple(plan.claims), now, fx)
    steps.claims = tuple(plan.claims)
    for decision in plan.decisions.values():
        job = jobs.get(decision.job_id)
        if job is None or not job.active or job.id in skip:
            continue
        before = (job.schedule_state, job.reason, job.message, job.infeasible_since)
        job.schedule_state = decision.state
        if decision.infeasible:
            job.infeasible_since = job.infeasible_since if job.infeasible_since else now
        else:
            job.infeasible_since = None
        if job.stage == Stage.PENDING or decision.state == ScheduleState.SCHEDULED_PARTLY:
            job.reason, job.message = decision.reason, decision.message
        if (job.schedule_state, job.reason, job.message, job.infeasible_since) != before:
            fx.jobs.add(job.id)  # an unchanged verdict costs no write and no news
            touched[job.id] = job
    for job in touched.values():
        steps.reconcile(job, now, fx)
    return fx


def _reserve(steps: PlanSteps, reservation: Reservation | None, now: float, fx: Effects) -> None:
    """_reserve keeps the plan's reservation for the next snapshot and records changes."""
    before, steps.reservation = steps.reservation, reservation
    if reservation is None or reservation == before:
        return
    job = steps.jobs.get(reservation.job_id)
    if job is None:
        return
    added = [n for n in reservation.nodes if before is None or n not in before.nodes]
    if added:
        message = (
            f"node {', '.join(added)} locked against starvation ({len(reservation.nodes)} in all)"
        )
        fx.event(now, "Reserved", message, job)
