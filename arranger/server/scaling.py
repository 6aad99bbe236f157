"""scaling: a worker set's wanted count changed while its job lives (arranger scale, ScaleJob).

A set's `counts` is the number of workers wanted now, within [minCount, maxCounts]. Scaling
writes the new count into the job's spec (stored with the job, as `kubectl scale` writes a
Deployment's replicas), so a restarted server and a standby know it, and then:

- Workers added are placed as the job's surplus (never in its gang minimum): the scheduler
  places them in backfill order and never evicts anyone for them. A worker that a scale-down
  removed comes back as a new attempt of its old pod, with its old rank.
- Workers removed are the highest indices: one not yet launched ends at once; one running is
  stopped with the job's preemption grace. Each ends `ScaledDown`, counting no restart.
- The gang minimum is taken again over the workers wanted, preferring those holding a node,
  so that a running job never gains a missing minimum by being scaled.
"""

from __future__ import annotations

from typing import Protocol

from arranger.server.convert import spec_to_json
from arranger.server.effects import Effects
from arranger.server.model import IN_PLACE, NO_REQUEUE, JobRecord, PodRecord, new_pod
from arranger.states import SCALED_DOWN, BasicPolicy, PodState


class PodSteps(Protocol):
    """PodSteps: the controller's steps that stop a pod or send it back to the scheduler,
    which scaling and evictions take."""

    def kill(
        self,
        pod: PodRecord,
        reason: str,
        remove_scratch: bool,
        fx: Effects,
        grace_s: float | None = None,
    ) -> None: ...

    def unplace(self, pod: PodRecord) -> None: ...

    def grace_of(self, job: JobRecord) -> float: ...


class ScaleSteps(PodSteps, Protocol):
    """ScaleSteps: the controller's job steps a scale takes."""

    def reconcile(self, job: JobRecord, now: float, fx: Effects) -> None: ...


def scale_problem(job: JobRecord, worker_set: str, counts: int) -> tuple[str, str] | None:
    """scale_problem: why the set of this job may not be scaled to `counts`, as (the gRPC
    status name, a message naming the field and the rule); None if it may."""
    if job.deleted or job.terminating or job.stage.finished:
        return "FAILED_PRECONDITION", f"job {job.name!r} has ended; only a live job is scaled"
    spec = job.spec
    ws = spec.worker_set(worker_set)
    if ws is None:
        sets = ", ".join(w.name for w in spec.worker_sets) or "none"
        return "NOT_FOUND", f"workerSet: job {job.name!r} has no set {worker_set!r} (sets: {sets})"
    if spec.basic_policy == BasicPolicy.GANG:
        return "FAILED_PRECONDITION", (
            f"workerSet: job {job.name!r} has basicPolicy Gang, whose sets have a fixed size"
        )
    if counts > ws.most:
        return "INVALID_ARGUMENT", f"counts: must be at most the set's maxCounts ({ws.most})"
    if counts < ws.min_count:
        return "INVALID_ARGUMENT", f"counts: must be at least the set's minCount ({ws.min_count})"
    if ws.auxiliary:  # a helper role: minWorkersNum does not count it
        return None
    total = spec.counted_workers - ws.counts + counts
    if total < spec.min_workers_num:
        return "INVALID_ARGUMENT", (
            f"counts: the job would want {total} workers, fewer than its minWorkersNum "
            f"({spec.min_workers_num})"
        )
    failed = sum(
        1
        for p in job.workers()
        if p.done
        and p.state != PodState.SUCCEEDED
        and not spec.is_auxiliary(p.worker_set)
        and (p.worker_set != ws.name or p.index < counts)
    )
    if failed > total - spec.min_workers_num:  # the job would fail TooFewWorkers at once
        return "FAILED_PRECONDITION", (
            f"counts: {failed} of the {total} workers the job would want failed for good; "
            f"fewer than its minWorkersNum ({spec.min_workers_num}) could run"
        )
    return None


def scale(
    steps: ScaleSteps, job: JobRecord, worker_set: str, counts: int, now: float, by: str = ""
) -> Effects:
    """scale changes the set's wanted count (checked by scale_problem first) and orders what
    follows; `by` is who asked."""
    fx = Effects()
    ws = job.spec.worker_set(worker_set)
    assert ws is not None
    before = ws.counts
    if counts == before:
        return fx
    job.spec = job.spec.scaled(worker_set, counts)
    job.spec_json = spec_to_json(job.spec)
    fx.jobs.add(job.id)
    fx.schedule = True
    for index in range(before, counts):
        _add(steps, job, worker_set, index, fx)
    for index in reversed(range(counts, before)):
        pod = job.pods.get(f"{job.name}-{worker_set}-{index}")
        if pod is not None:
            _remove(steps, job, pod, fx)
    _take_minimum(job, fx)
    who = f" by {by}" if by else ""
    message = f"set {worker_set}: {before} to {counts} workers{who}"
    fx.event(now, "Scaled", message, job)
    steps.reconcile(job, now, fx)
    return fx


def _add(steps: ScaleSteps, job: JobRecord, worker_set: str, index: int, fx: Effects) -> None:
    """_add makes worker `index` of the set wanted: a new pod, the next attempt of one a
    scale-down ended, or one still stopping from it, which runs again where it is."""
    name = f"{job.name}-{worker_set}-{index}"
    pod = job.pods.get(name)
    if pod is None:
        pod = new_pod(job.id, job.spec, worker_set, index)
        job.pods[name] = pod
        job.pods = dict(sorted(job.pods.items(), key=lambda item: item[1].rank))
    elif pod.live:
        pod.requeue = IN_PLACE  # stopping for the scale-down: it starts again once ended
    elif pod.done:
        pod.attempt += 1
        steps.unplace(pod)
        pod.exit_code, pod.reason, pod.pid, pod.not_before = None, "", 0, 0.0
        pod.start_time, pod.finish_time = None, None
        pod.stopping, pod.requeue, pod.done = False, NO_REQUEUE, False
    fx.pods.add(pod.uid)


def _remove(steps: ScaleSteps, job: JobRecord, pod: PodRecord, fx: Effects) -> None:
    """_remove ends a worker no longer wanted: at once if nothing of it runs, else it is
    stopped with the job's preemption grace (pod_ended then ends it ScaledDown)."""
    if pod.done:
        return
    fx.pods.add(pod.uid)
    pod.end_notice()
    if pod.live:
        pod.requeue = NO_REQUEUE
        steps.kill(pod, SCALED_DOWN, False, fx, steps.grace_of(job))
        return
    if pod.state == PodState.PLACED:
        steps.unplace(pod)
    pod.state, pod.reason, pod.done = PodState.KILLED, SCALED_DOWN, True


def _take_minimum(job: JobRecord, fx: Effects) -> None:
    """_take_minimum chooses the gang minimum again among the workers wanted, preferring
    those that hold a node. A surplus worker under notice that joins the minimum keeps
    running: its notice is withdrawn, as the minimum goes only with the whole job."""
    holding = [p.rank for p in job.workers() if p.state.holds_resources]
    minimum = job.spec.minimum_ranks(holding)
    whole_notice = job.leader.evict_at is not None
    for pod in job.workers():
        in_minimum = pod.rank in minimum
        if pod.in_minimum != in_minimum:
            pod.in_minimum = in_minimum
            fx.pods.add(pod.uid)
            if in_minimum and not whole_notice:
                pod.end_notice()
