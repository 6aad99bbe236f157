"""lifecycle: a job's way through its stages as its pods are launched, run and end (DESIGN §3).

After any stimulus touching a job, `reconcile` looks at the whole job and decides (level
triggered, like a Kubernetes reconciler), so the same state always leads to the same orders:
it launches what may launch, moves the job's stage on, finishes it (cleanPodPolicy, history)
or reaps a deleted one. `pod_ended` decides what follows an attempt's end: nothing more, a
rerun without a restart counted (requeued, evicted, stopped with its agent, lost with its
node), a retry for an exit code the spec names transient (retryOnExitCodes), or a restart after
back-off while restartLimit allows. Pure: what it needs of the controller comes through
LifeSteps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from arranger.server import endings, evictions, helper_roles, stalls
from arranger.server.contract import launch_order
from arranger.server.controller_config import ControllerConfig
from arranger.server.effects import Effects, KillOrder
from arranger.server.evictions import EvictionSteps
from arranger.server.history import charge, has_record, launched, record_of
from arranger.server.model import IN_PLACE, NO_REQUEUE, JobRecord, NodeRecord, PodRecord
from arranger.states import (
    AGENT_STOPPED,
    SCALED_DOWN,
    CleanPodPolicy,
    NodeState,
    PodState,
    Role,
    ScheduleState,
    Stage,
)


class LifeSteps(EvictionSteps, Protocol):
    """LifeSteps: what a job's lifecycle takes of the controller: its config and nodes, the
    steps that stop a pod or change a stage, and forgetting a job reaped."""

    @property
    def config(self) -> ControllerConfig: ...

    @property
    def nodes(self) -> Mapping[str, NodeRecord]: ...

    def withdraw(self, job: JobRecord) -> None: ...


def reconcile(steps: LifeSteps, job: JobRecord, now: float, fx: Effects) -> None:
    """reconcile looks at the whole job after it or its pods changed and decides what follows:
    a deleted job is reaped, a job whose end is settled finishes, any other advances."""
    if job.deleted:
        _reap(steps, job, now, fx)
        return
    if job.stage.finished:
        return
    leader, spec = job.leader, job.spec
    failed_workers = sum(
        1
        for w in job.workers()
        if w.done and w.state != PodState.SUCCEEDED and not spec.is_auxiliary(w.worker_set)
    )
    ended = helper_roles.leader_ended(job)
    if job.terminating and not ended:
        who = f" of {job.stopped_by}" if job.stopped_by else ""
        finish(steps, job, Stage.SUCCEEDED, "Stopped", f"stopped by request{who}", now, fx)
    elif ended and not job.terminating and helper_roles.winds_down(steps, job, now, fx):
        return  # auxiliary workers finish within their terminationDelaySeconds; a stop ends
        # that wait, and the job ends as its leader decided either way
    elif leader.state == PodState.SUCCEEDED:
        finish(steps, job, Stage.SUCCEEDED, "LeaderSucceeded", f"{leader.name} exited 0", now, fx)
    elif leader.done:
        finish(steps, job, Stage.FAILED, *endings.leader_failure(job), now, fx)
    elif failed_workers > spec.counted_workers - spec.required_workers:
        message = endings.too_few_workers(job, failed_workers)
        finish(steps, job, Stage.FAILED, "TooFewWorkers", message, now, fx)
    elif job.schedule_state == ScheduleState.SCHEDULED_FAILED:
        finish(steps, job, Stage.FAILED, "Unschedulable", job.message, now, fx)
    else:
        _advance(steps, job, now, fx)


def _advance(steps: LifeSteps, job: JobRecord, now: float, fx: Effects) -> None:
    """_advance launches what may launch (the leader first, its workers once it runs with an
    address) and moves the job on: Pending to Starting once its leader is placed, Starting to
    Running once the leader and minWorkersNum workers run (or ended well)."""
    leader = job.leader
    if job.stage == Stage.PENDING:
        if leader.state != PodState.PLACED or job.schedule_state == ScheduleState.UNSCHEDULED:
            return
        steps.set_stage(job, Stage.STARTING, "Scheduled", "launching the leader", now, fx)
        job.start_time = now
    if leader.state == PodState.PLACED and _launchable(steps, leader, now):
        _launch(steps, job, leader, now, fx)
        if job.stage == Stage.RESCHEDULING:
            steps.set_stage(
                job, Stage.STARTING, "LeaderPlaced", f"leader on {leader.node}", now, fx
            )
    if leader.state != PodState.RUNNING or not job.leader_address:
        return
    for worker in job.workers():
        if (
            worker.state == PodState.PLACED
            and _launchable(steps, worker, now)
            and helper_roles.may_start(job, worker)
        ):
            _launch(steps, job, worker, now, fx)
    counted = [w for w in job.workers() if not job.spec.is_auxiliary(w.worker_set)]
    running = sum(1 for w in counted if w.state == PodState.RUNNING and not w.stopping)
    finished = sum(1 for w in counted if w.state == PodState.SUCCEEDED)
    if job.stage == Stage.STARTING and running + finished >= job.spec.required_workers:
        message = f"leader and {running} of {job.spec.num_workers} workers running"
        steps.set_stage(job, Stage.RUNNING, "Running", message, now, fx)


def leader_running(
    steps: LifeSteps, job: JobRecord, leader: PodRecord, now: float, fx: Effects
) -> None:
    """leader_running records where the job's leader now runs (its address)."""
    node = steps.nodes.get(leader.node)
    port_name = job.spec.leader.ports[0]
    port = leader.ports.get(port_name)
    if node is not None and port:
        job.leader_address = f"{node.address}:{port}"
        fx.jobs.add(job.id)
    fx.event(now, "LeaderStarted", f"{leader.name} running at {job.leader_address}", job)


def pod_ended(
    steps: LifeSteps,
    job: JobRecord,
    pod: PodRecord,
    state: PodState,
    exit_code: int | None,
    reason: str,
    now: float,
    fx: Effects,
    ended_at: float | None = None,
) -> None:
    """pod_ended records the end of the pod's attempt and prepares what comes next (nothing,
    a rerun in place or elsewhere, a restart after back-off); `ended_at`: when it ended, by the
    server's clock, if known (else `now`)."""
    if ended_at is not None and pod.start_time is not None:
        ended_at = max(ended_at, pod.start_time)  # clocks measured apart never reverse a run
    end = ended_at if ended_at is not None else now
    if charge(job, pod, end):  # usage up to its end, not to when the news came
        fx.jobs.add(job.id)
    if state != PodState.LOST and stalls.restarts(job, pod, pod.stopping):  # stopped for its
        # stall (and not lost with its node meanwhile): a failure
        state, reason, pod.stopping = PodState.FAILED, stalls.STALLED, False
    pod.state, pod.exit_code, pod.reason = state, exit_code, reason
    pod.finish_time, pod.pid = end, 0
    was_stopping, pod.stopping = pod.stopping, False
    evictions.attempt_ended(job, pod)
    fx.pods.add(pod.uid)
    fx.schedule = True
    if job.stage.finished or job.deleted or pod.done:
        pod.done = True
        if has_record(job):  # its record takes the exit code in, once per write
            fx.rerecord.add(job.id)
        return
    if pod is not job.leader and helper_roles.leader_ended(job):
        pod.done = True  # the job winds down: nothing runs again
        return
    if not job.spec.wants(pod.worker_set, pod.index):  # a scale-down removed it
        pod.done, pod.reason, pod.requeue = True, SCALED_DOWN, NO_REQUEUE
        return
    if pod.requeue:
        where, pod.requeue = pod.requeue, NO_REQUEUE
        _rerun(steps, job, pod, now, restarts=0, in_place=where == IN_PLACE)
        _follow_leader(steps, job, pod, now, fx)
        return
    if state == PodState.SUCCEEDED or (state == PodState.KILLED and was_stopping):
        pod.done = pod.role == Role.WORKER
        return
    if state == PodState.KILLED and reason == AGENT_STOPPED:
        # Its agent stopped it on the way out (stopPodsOnExit, arranger dev): nothing of
        # the pod failed, so it runs again, as an eviction does, with no restart counted.
        message = f"{pod.name} stopped with the agent on {pod.node}; it runs again"
        fx.event(now, "Requeued", message, job, pod.name)
        _rerun(steps, job, pod, now, restarts=0)
        _follow_leader(steps, job, pod, now, fx)
        return
    if state == PodState.LOST and _requeued_lost(steps, job, pod, reason, now, fx):
        return
    if endings.start_failure(pod):  # it would fail the same way again: no restart, no back-off
        _never_starts(steps, job, pod, now, fx)
        return
    if _retried(steps, job, pod, state, now, fx):
        return
    if pod.role == Role.LEADER:
        if job.leader_restarts >= job.spec.restart_limit:
            pod.done = True
            return
        job.leader_restarts += 1
        restarts = job.leader_restarts
    else:
        used = job.set_restarts.get(pod.worker_set, 0)
        if used >= job.spec.restart_limit:
            pod.done = True
            ended = f"{pod.name} {state.lower()}{endings.exit_text(pod)}"
            fx.event(now, "WorkerFailed", f"{ended}; no restarts left", job, pod.name)
            return
        job.set_restarts[pod.worker_set] = restarts = used + 1
    fx.jobs.add(job.id)
    ended, limit = f"{pod.name} {state.lower()}{endings.exit_text(pod)}", job.spec.restart_limit
    fx.event(now, "Restarting", f"{ended}; restart {restarts} of {limit}", job, pod.name)
    _rerun(steps, job, pod, now, restarts)
    _follow_leader(steps, job, pod, now, fx)


def _requeued_lost(
    steps: LifeSteps, job: JobRecord, pod: PodRecord, reason: str, now: float, fx: Effects
) -> bool:
    """_requeued_lost: a pod lost with its node (silent past nodeTimeoutSeconds, fenced) or by
    an agent that came back without it failed in nothing of its own, so it runs again
    (elsewhere if its node is not Ready) with no restart spent, as Slurm requeues on node
    failure: a transient retry, after back-off from the second on. Past transientRetryLimit
    (a pod that takes its node down each time) restartLimit decides."""
    ended = f"{pod.name} lost ({reason})"
    retry = _spend_retry(steps, job, pod, ended, now, fx)
    if retry is None:
        return False
    limit = steps.config.transient_retry_limit
    message = f"{ended}; it runs again, no restart spent (retry {retry} of {limit})"
    fx.event(now, "Requeued", message, job, pod.name)
    _rerun(steps, job, pod, now, retry - 1)
    _follow_leader(steps, job, pod, now, fx)
    return True


def _retried(
    steps: LifeSteps, job: JobRecord, pod: PodRecord, state: PodState, now: float, fx: Effects
) -> bool:
    """_retried: a pod that failed with an exit code its spec lists in retryOnExitCodes (a
    transient failure: an NCCL timeout's code, say) restarts after back-off without spending
    restartLimit, while its leader's or set's retries (these and its losses with its node)
    stay under transientRetryLimit; past that, restartLimit decides as for any failure."""
    code = pod.exit_code
    if state != PodState.FAILED or code is None or code not in job.spec.retry_codes(pod.worker_set):
        return False
    ended = f"{pod.name} {state.lower()}{endings.exit_text(pod)}"
    retry = _spend_retry(steps, job, pod, ended, now, fx)
    if retry is None:
        return False
    limit = steps.config.transient_retry_limit
    message = f"{ended}, in retryOnExitCodes; retry {retry} of {limit} (no restart spent)"
    fx.event(now, "Retrying", message, job, pod.name)
    _rerun(steps, job, pod, now, retry)
    _follow_leader(steps, job, pod, now, fx)
    return True


def _spend_retry(
    steps: LifeSteps, job: JobRecord, pod: PodRecord, ended: str, now: float, fx: Effects
) -> int | None:
    """_spend_retry: the number of the pod's role's next transient retry (counted in
    `job.retries`), or None once transientRetryLimit is spent (said: restartLimit decides)."""
    used, limit = job.retries.get(pod.worker_set, 0), steps.config.transient_retry_limit
    if used >= limit:
        message = f"{ended}; its {limit} transient retries are spent: restartLimit decides"
        fx.event(now, "RetriesSpent", message, job, pod.name)
        return None
    job.retries[pod.worker_set] = used + 1
    fx.jobs.add(job.id)
    return used + 1


def _never_starts(
    steps: LifeSteps, job: JobRecord, pod: PodRecord, now: float, fx: Effects
) -> None:
    """_never_starts: a pod whose program can never start is done (a leader's job then
    fails); a worker spends its set's restarts, as if restartLimit were used up."""
    pod.done = True
    if pod.role == Role.WORKER:
        used = job.set_restarts.get(pod.worker_set, 0)
        job.set_restarts[pod.worker_set] = max(used, job.spec.restart_limit)
        fx.jobs.add(job.id)
        message = f"{endings.why_not_started(pod)}; set {pod.worker_set} has no restarts left"
        fx.event(now, "WorkerFailed", message, job, pod.name)


def _follow_leader(
    steps: LifeSteps, job: JobRecord, pod: PodRecord, now: float, fx: Effects
) -> None:
    """_follow_leader: a leader that must move to another node sends the job to
    Rescheduling; its running workers are stopped to start again with the new address."""
    if pod.role != Role.LEADER or pod.state != PodState.PENDING or job.stage == Stage.PENDING:
        return
    if evictions.leader_gone(steps, job, now, fx):  # under notice: it is evicted instead
        return
    message = "the leader moves to another node; workers restart with its new address"
    steps.set_stage(job, Stage.RESCHEDULING, "LeaderMoved", message, now, fx)
    job.leader_address = ""
    for worker in job.workers():
        if worker.live:
            worker.requeue = IN_PLACE
            steps.kill(worker, "Rescheduling", False, fx)


def _rerun(
    steps: LifeSteps,
    job: JobRecord,
    pod: PodRecord,
    now: float,
    restarts: int,
    in_place: bool = True,
) -> None:
    """_rerun prepares the pod's next attempt: in place on its node (keeping its ports) when
    that node is still Ready and not cordoned, else (or when not `in_place`) back to
    Pending for the scheduler."""
    pod.attempt += 1
    pod.exit_code, pod.start_time, pod.finish_time = None, None, None
    pod.progress_at = pod.gpu_idle_since = None
    backoff = 0.0
    if restarts > 0:
        backoff = min(
            steps.config.backoff_initial_s * 2 ** (restarts - 1), steps.config.backoff_max_s
        )
    pod.not_before = now + backoff
    node = steps.nodes.get(pod.node)
    if in_place and node is not None and node.state == NodeState.READY and not node.cordoned:
        pod.state = PodState.PLACED
    else:
        steps.unplace(pod)


def finish(
    steps: LifeSteps,
    job: JobRecord,
    stage: Stage,
    reason: str,
    message: str,
    now: float,
    fx: Effects,
) -> None:
    """finish ends the job, applies cleanPodPolicy to its pods and writes its history
    record (with the same commit): usage is counted up to now, whatever still runs."""
    steps.set_stage(job, stage, reason, message, now, fx)
    job.finish_time = now
    leader = job.leader
    if leader.state.terminal and leader.finish_time is not None:
        # It ended with its leader, which may have ended before the news came (its agent
        # was away): then, not when the agent came back.
        job.finish_time = min(now, max(leader.finish_time, job.start_time or 0.0))
    policy = job.spec.clean_pod_policy
    for pod in job.pods.values():
        if charge(job, pod, now):
            fx.pods.add(pod.uid)
    fx.history.append(record_of(job))
    fx.ended.add(job.id)
    evictions.job_ended(job, fx)
    for pod in job.pods.values():
        pod.done = True
        if pod.state in (PodState.PENDING, PodState.PLACED):
            pod.state, pod.reason = PodState.KILLED, "JobFinished"
            fx.pods.add(pod.uid)
        elif pod.live and policy != CleanPodPolicy.NONE:
            steps.kill(pod, "JobFinished", policy == CleanPodPolicy.ALL, fx)
        elif pod.node and policy == CleanPodPolicy.ALL and pod.state.terminal:
            fx.kills.append(KillOrder(pod.node, pod.uid, pod.attempt, 0.0, "Cleanup", True))
    fx.schedule = True


def _reap(steps: LifeSteps, job: JobRecord, now: float, fx: Effects) -> None:
    """_reap stops a deleted job's processes and, once none is left, forgets the job."""
    for pod in job.pods.values():
        pod.done = True
        if pod.state in (PodState.PENDING, PodState.PLACED):
            pod.state = PodState.KILLED
        elif pod.live:
            steps.kill(pod, "JobDeleted", True, fx)
    if any(p.live for p in job.pods.values()):
        return
    steps.withdraw(job)
    fx.removed[job.id] = job
    fx.purges.append(job.id)
    fx.schedule = True


def _launchable(steps: LifeSteps, pod: PodRecord, now: float) -> bool:
    """_launchable: the pod's node is connected, its back-off has passed and it is not being
    stopped to run again."""
    node = steps.nodes.get(pod.node)
    return node is not None and node.connected and pod.not_before <= now and not pod.requeue


def _launch(steps: LifeSteps, job: JobRecord, pod: PodRecord, now: float, fx: Effects) -> None:
    """_launch orders the pod's attempt started on its node (Launching until it reports)."""
    node = steps.nodes[pod.node]
    pod.state, pod.stopping, pod.reason = PodState.LAUNCHING, False, ""
    if launched(job, pod, now):
        fx.jobs.add(job.id)
    fx.pods.add(pod.uid)
    grace = steps.config.preemption_grace(job.spec)
    fx.launches.append(launch_order(job, pod, node, steps.config.kill_grace_s, grace))
