"""controller drives every job through its stages (DESIGN §3): a pure state machine.

Stimuli (a submit, a plan, a pod report, a node joining or going silent, the clock) mutate the
records and return Effects; the shell stores them and then sends the orders. The controller
never does I/O and never reads a clock: `now` comes with every stimulus.

After any stimulus touching a job, `_reconcile` looks at the whole job and decides (level
triggered, like a Kubernetes reconciler), so the same state always leads to the same orders.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence

from arranger.sched import Plan
from arranger.sched.plan import Claim, Reservation
from arranger.server import endings, evictions, scaling
from arranger.server.contract import launch_order
from arranger.server.controller_config import ControllerConfig
from arranger.server.effects import Effects, KillOrder
from arranger.server.history import charge, launched, record_of
from arranger.server.listing import JobOrder, key_of
from arranger.server.model import (
    IN_PLACE,
    NO_REQUEUE,
    JobRecord,
    NodeRecord,
    PodRecord,
    new_pods,
)
from arranger.server.node_events import NodeBook
from arranger.server.nodes import NodeRegistration, PodReport
from arranger.server.queues import DEFAULT, QueueRecord
from arranger.server.view import ClusterView
from arranger.spec import DEFAULT_QUEUE, JobSpec
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

# Checkpoint confirmations closer together than this (with no notice running) are kept once.
CHECKPOINT_STEP_S = 1.0


class Controller:
    """Controller holds every job, pod and node record and applies stimuli to them; `view`
    answers every query of them from outside. `order` holds every job of `jobs` in listing
    order (submit time, then id). Node stimuli go to `node_book`, which owns `nodes` and takes
    its job steps here (it is its JobSteps). `node_timeout_s` is config's until the server
    stretches it as the cluster grows (see heartbeats)."""

    def __init__(self, config: ControllerConfig | None = None) -> None:
        self.config = config or ControllerConfig()
        self.node_timeout_s = self.config.node_timeout_s
        self.jobs: dict[str, JobRecord] = {}
        self.order = JobOrder()
        self.names: dict[str, list[str]] = {}  # name -> its jobs not deleted, oldest first
        self.node_book = NodeBook(self, self.config.kill_grace_s, self.config.replace_lost_pods)
        self.nodes = self.node_book.records  # the node book's, read by the job steps here
        self.queues: dict[str, QueueRecord] = {DEFAULT_QUEUE: DEFAULT}
        self.reservation: Reservation | None = None  # kept in memory: re-elected after a restart
        self.claims: tuple[Claim, ...] = ()  # room being freed for waiting jobs (in memory too)
        # node -> the jobs with a pod placed there at some time (a superset of those holding
        # something there now): what a node's events look at, instead of every job.
        self.placed_on: dict[str, set[str]] = {}
        self.view = ClusterView(
            jobs=self.jobs,
            order=self.order,
            names=self.names,
            nodes=self.nodes,
            queues=self.queues,
            placed_on=self.placed_on,
        )

    # Names.

    def remember_name(self, job: JobRecord) -> None:
        """remember_name lets the job's name reach it (kept in listing order)."""
        ids = self.names.setdefault(job.name, [])
        if job.id not in ids:
            ids.append(job.id)
            if len(ids) > 1 and key_of(self.jobs[ids[-2]]) > key_of(job):
                ids.sort(key=lambda i: key_of(self.jobs[i]))

    def forget_name(self, job: JobRecord) -> None:
        """forget_name: the job's name no longer reaches it (deleted, withdrawn, pruned)."""
        ids = self.names.get(job.name)
        if ids is not None and job.id in ids:
            ids.remove(job.id)
            if not ids:
                del self.names[job.name]

    # Records as stored: after a restart, and after a write that failed (see rollback).

    def restore(
        self,
        jobs: list[JobRecord],
        nodes: list[NodeRecord],
        now: float,
        queues: Sequence[QueueRecord] = (),
    ) -> Effects:
        """restore loads stored records after a restart. Every node is given nodeTimeout from
        now to reconnect before its pods are declared Lost; none takes new pods until it does."""
        for queue in queues:
            self.queues[queue.name] = queue
        self.node_book.restore(nodes, now)
        for job in jobs:
            self.put_back_job(job)
        fx = Effects()
        for job in jobs:
            if job.deleted:
                self.reconcile(job, now, fx)  # reaped now if nothing of it still runs
        return fx

    def put_back_job(self, job: JobRecord) -> None:
        """put_back_job makes a job as stored known: by id, in listing order, by its name
        (unless deleted), and on the nodes its pods are placed on."""
        self.jobs[job.id] = job
        self.order.add(job)
        if not job.deleted:
            self.remember_name(job)
        for pod in job.pods.values():
            if pod.node:
                self.placed_on.setdefault(pod.node, set()).add(job.id)

    def put_back_queue(self, name: str, queue: QueueRecord | None) -> None:
        """put_back_queue makes the queue as stored (None: there is none of that name)."""
        if queue is None:
            self.queues.pop(name, None)
        else:
            self.queues[name] = queue

    # Client stimuli.

    def submit(
        self, job_id: str, spec: JobSpec, spec_json: str, now: float, owner: str = ""
    ) -> tuple[JobRecord, Effects]:
        """submit adds a job. Its submit time is `now`, or just after the newest job's if the
        clock has not moved past it: each new job comes last in listing order, so a client
        paging through the jobs meets those submitted meanwhile on a later page."""
        newest = self.order.newest()
        if newest is not None and now <= newest[0]:
            now = math.nextafter(newest[0], math.inf)
        job = JobRecord(id=job_id, spec=spec, spec_json=spec_json, submit_time=now, owner=owner)
        job.pods = new_pods(job_id, spec)
        job.reason, job.message = "Submitted", "waiting for the scheduler"
        self.jobs[job_id] = job
        self.order.add(job)
        self.remember_name(job)
        fx = Effects(schedule=True)
        self._touch_job(job, fx)
        fx.pods.update(p.uid for p in job.pods.values())
        pods = len(job.pods)
        fx.event(now, "Submitted", f"{pods} pods, priority {spec.priority}", job)
        return job, fx

    def withdraw(self, job: JobRecord) -> None:
        """withdraw forgets a job as if never submitted: its submit could not be stored, or
        retention prunes it."""
        self.jobs.pop(job.id, None)
        self.order.remove(job)
        self.forget_name(job)

    def stop(self, job: JobRecord, now: float, by: str = "") -> Effects:
        """stop ends the job (it Succeeds, reason Stopped); `by` is the user who asked."""
        fx = Effects()
        if not job.terminating and not job.stage.finished:
            job.terminating, job.stopped_by = True, by
            self._touch_job(job, fx)
            fx.event(now, "StopRequested", "terminating set", job)
            self.reconcile(job, now, fx)
        return fx

    def delete(self, job: JobRecord, now: float) -> Effects:
        fx = Effects(schedule=True)
        job.deleted = True
        self.forget_name(job)
        self._touch_job(job, fx)
        fx.event(now, "Deleted", "deleted by request", job)
        self.reconcile(job, now, fx)
        return fx

    def scale(
        self, job: JobRecord, worker_set: str, counts: int, now: float, by: str = ""
    ) -> Effects:
        """scale changes a worker set's wanted count (see arranger.server.scaling; checked
        there by scale_problem first)."""
        return scaling.scale(self, job, worker_set, counts, now, by)

    def confirm_checkpoint(self, job: JobRecord, now: float) -> Effects | None:
        """confirm_checkpoint: the job's learner has checkpointed, now. That is kept as the
        job's last checkpoint (of otherwise equal victims, the one losing least work goes
        first), and a notice of the whole job's eviction, if one runs, ends now. None when the
        job has ended (nothing is kept). Without a notice running, a confirmation within
        CHECKPOINT_STEP_S of the last one kept changes nothing: a learner confirming in a loop
        writes to the store at most that often."""
        if job.deleted or job.stage.finished:
            return None
        fx = Effects()
        noticed = job.active and job.leader.evict_at is not None
        last = job.checkpoint_time
        if not noticed and last is not None and 0 <= now - last < CHECKPOINT_STEP_S:
            return fx
        job.checkpoint_time = now
        self._touch_job(job, fx)
        if evictions.confirm(self, job, now, fx):
            self.reconcile(job, now, fx)
        return fx

    # Queues.

    def put_queue(self, queue: QueueRecord, now: float) -> Effects:
        """put_queue creates or replaces a queue."""
        fx = Effects(queues={queue.name}, schedule=True)
        verb = "QueueUpdated" if queue.name in self.queues else "QueueCreated"
        self.queues[queue.name] = queue
        fx.event(now, verb, f"queue {queue.name}: weight {queue.weight:g}")
        return fx

    def delete_queue(self, name: str, now: float) -> Effects:
        fx = Effects(removed_queues={name}, schedule=True)
        self.queues.pop(name, None)
        fx.event(now, "QueueDeleted", f"queue {name}")
        return fx

    # Scheduler stimulus.

    def apply_plan(self, plan: Plan, now: float, skip: Collection[str] = ()) -> Effects:
        """apply_plan binds placed pods and records each job's schedule state (skipping pods
        that changed since the snapshot, and all of the jobs in `skip`); notices given for
        claims that no longer stand are withdrawn."""
        fx = Effects()
        touched: dict[str, JobRecord] = {}
        for placement in plan.placements:
            if placement.job_id in skip:
                continue
            job = self.jobs.get(placement.job_id)
            pod = job.pods.get(placement.pod) if job else None
            node = self.nodes.get(placement.node)
            if job is None or pod is None or node is None or not job.active:
                continue
            if pod.state != PodState.PENDING or pod.done:
                continue
            pod.state, pod.node, pod.gpus = PodState.PLACED, node.name, placement.gpus
            self.placed_on.setdefault(node.name, set()).add(job.id)
            fx.pods.add(pod.uid)
            touched[job.id] = job
        evictions.evict(self, self.jobs, plan.evictions, now, fx, touched)
        self._reserve(plan.reservation, now, fx)
        evictions.withdraw(self.jobs, self.claims, tuple(plan.claims), now, fx)
        self.claims = tuple(plan.claims)
        for decision in plan.decisions.values():
            job = self.jobs.get(decision.job_id)
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
                self._touch_job(job, fx)  # an unchanged verdict costs no write and no news
                touched[job.id] = job
        for job in touched.values():
            self.reconcile(job, now, fx)
        return fx

    def _reserve(self, reservation: Reservation | None, now: float, fx: Effects) -> None:
        """_reserve keeps the plan's reservation for the next snapshot and records changes."""
        before, self.reservation = self.reservation, reservation
        if reservation is None or reservation == before:
            return
        job = self.jobs.get(reservation.job_id)
        if job is None:
            return
        added = [n for n in reservation.nodes if before is None or n not in before.nodes]
        if added:
            message = f"node {', '.join(added)} locked against starvation ({len(reservation.nodes)} in all)"
            fx.event(now, "Reserved", message, job)

    # The clock.

    def tick(self, now: float, jobs: Iterable[JobRecord] | None = None) -> Effects:
        """tick launches pods whose restart back-off has passed, and fails jobs that ran past
        their maxRuntimeSeconds. `jobs`: those that may still change with time (default: all)."""
        fx = Effects()
        for job in list(self.jobs.values() if jobs is None else jobs):
            deadline = job.deadline
            if deadline is not None and now >= deadline:
                message = f"ran longer than maxRuntimeSeconds ({job.spec.max_runtime_s:g})"
                self._finish(job, Stage.FAILED, "MaxRuntimeExceeded", message, now, fx)
                continue
            notice = evictions.due(job) if job.active else None
            if notice is not None and notice <= now:
                evictions.expire(self, job, now, fx)
                self.reconcile(job, now, fx)
            elif any(p.state == PodState.PLACED and p.not_before <= now for p in job.pods.values()):
                self.reconcile(job, now, fx)
        return fx

    def timer(self, job_id: str) -> float | None:
        """timer: the earliest time the clock alone changes the job (the tick's work): a placed
        pod's back-off ends, an eviction notice ends, or the job runs past its
        maxRuntimeSeconds; None if none."""
        job = self.jobs.get(job_id)
        if job is None:
            return None
        times = [p.not_before for p in job.pods.values() if p.state == PodState.PLACED]
        if (notice := evictions.due(job)) is not None:
            times.append(notice)
        if not job.active:
            times.clear()
        if (deadline := job.deadline) is not None:
            times.append(deadline)
        return min(times, default=None)

    # Nodes (see NodeBook).

    def node_registered(self, reg: NodeRegistration, now: float) -> Effects:
        return self.node_book.node_registered(reg, now)

    def node_resync(self, name: str, reports: list[PodReport], now: float) -> Effects:
        return self.node_book.node_resync(name, reports, now)

    def node_disconnected(self, name: str, now: float) -> Effects:
        return self.node_book.node_disconnected(name, now)

    def seen(self, name: str, now: float) -> None:
        self.node_book.seen(name, now)

    def heartbeat(
        self,
        name: str,
        cpu_percent: float,
        memory_used: int,
        now: float,
        sent_at: float = 0.0,
        shares_held: bool | None = None,
    ) -> Effects:
        return self.node_book.heartbeat(name, cpu_percent, memory_used, now, sent_at, shares_held)

    def gpu_problems(self, name: str, problems: Mapping[int, str], now: float) -> Effects:
        return self.node_book.gpu_problems(name, problems, now)

    def check_nodes(self, now: float) -> Effects:
        return self.node_book.check_nodes(now, self.node_timeout_s)

    def pod_reports(self, node_name: str, reports: list[PodReport], now: float) -> Effects:
        return self.node_book.pod_reports(node_name, reports, now)

    def cordon(self, name: str, cordoned: bool, now: float) -> Effects:
        return self.node_book.cordon(name, cordoned, now)

    def drain(self, name: str, now: float) -> Effects:
        return self.node_book.drain(name, now)

    # Job steps (JobSteps, for the node book), the reconciler first.

    def pod_by_uid(self, uid: str) -> tuple[JobRecord, PodRecord] | None:
        return self.view.pod(uid)

    def jobs_on(self, node: str) -> list[JobRecord]:
        """jobs_on: the jobs that have (or had) a pod placed on the node (the ids of jobs no
        longer in memory are dropped from `placed_on` on the way)."""
        ids = self.placed_on.get(node)
        if ids:
            ids.difference_update([i for i in ids if i not in self.jobs])
        return self.view.jobs_on(node)

    def reconcile(self, job: JobRecord, now: float, fx: Effects) -> None:
        if job.deleted:
            self._reap(job, now, fx)
            return
        if job.stage.finished:
            return
        leader, spec = job.leader, job.spec
        failed_workers = sum(1 for w in job.workers() if w.done and w.state != PodState.SUCCEEDED)
        if job.terminating:
            self._finish(job, Stage.SUCCEEDED, "Stopped", "stopped by request", now, fx)
        elif leader.state == PodState.SUCCEEDED:
            self._finish(
                job, Stage.SUCCEEDED, "LeaderSucceeded", f"{leader.name} exited 0", now, fx
            )
        elif leader.done:
            self._finish(job, Stage.FAILED, *endings.leader_failure(job), now, fx)
        elif failed_workers > spec.num_workers - spec.required_workers:
            message = endings.too_few_workers(job, failed_workers)
            self._finish(job, Stage.FAILED, "TooFewWorkers", message, now, fx)
        elif job.schedule_state == ScheduleState.SCHEDULED_FAILED:
            self._finish(job, Stage.FAILED, "Unschedulable", job.message, now, fx)
        else:
            self._advance(job, now, fx)

    def _advance(self, job: JobRecord, now: float, fx: Effects) -> None:
        leader = job.leader
        if job.stage == Stage.PENDING:
            if leader.state != PodState.PLACED or job.schedule_state == ScheduleState.UNSCHEDULED:
                return
            self.set_stage(job, Stage.STARTING, "Scheduled", "launching the leader", now, fx)
            job.start_time = now
        if leader.state == PodState.PLACED and self._launchable(leader, now):
            self._launch(job, leader, now, fx)
            if job.stage == Stage.RESCHEDULING:
                self.set_stage(
                    job, Stage.STARTING, "LeaderPlaced", f"leader on {leader.node}", now, fx
                )
        if leader.state != PodState.RUNNING or not job.leader_address:
            return
        for worker in job.workers():
            if worker.state == PodState.PLACED and self._launchable(worker, now):
                self._launch(job, worker, now, fx)
        running = sum(1 for w in job.workers() if w.state == PodState.RUNNING and not w.stopping)
        finished = sum(1 for w in job.workers() if w.state == PodState.SUCCEEDED)
        if job.stage == Stage.STARTING and running + finished >= job.spec.required_workers:
            message = f"leader and {running} of {job.spec.num_workers} workers running"
            self.set_stage(job, Stage.RUNNING, "Running", message, now, fx)

    def leader_running(self, job: JobRecord, leader: PodRecord, now: float, fx: Effects) -> None:
        node = self.nodes.get(leader.node)
        port_name = job.spec.leader.ports[0]
        port = leader.ports.get(port_name)
        if node is not None and port:
            job.leader_address = f"{node.address}:{port}"
            self._touch_job(job, fx)
        fx.event(now, "LeaderStarted", f"{leader.name} running at {job.leader_address}", job)

    def pod_ended(
        self,
        job: JobRecord,
        pod: PodRecord,
        state: PodState,
        exit_code: int | None,
        reason: str,
        now: float,
        fx: Effects,
        ended_at: float | None = None,
    ) -> None:
        if ended_at is not None and pod.start_time is not None:
            ended_at = max(ended_at, pod.start_time)  # clocks measured apart never reverse a run
        end = ended_at if ended_at is not None else now
        if charge(job, pod, end):  # usage up to its end, not to when the news came
            self._touch_job(job, fx)
        pod.state, pod.exit_code, pod.reason = state, exit_code, reason
        pod.finish_time, pod.pid = end, 0
        was_stopping, pod.stopping = pod.stopping, False
        evictions.attempt_ended(job, pod)
        fx.pods.add(pod.uid)
        fx.schedule = True
        if job.stage.finished or job.deleted or pod.done:
            pod.done = True
            return
        if not job.spec.wants(pod.worker_set, pod.index):  # a scale-down removed it
            pod.done, pod.reason, pod.requeue = True, SCALED_DOWN, NO_REQUEUE
            return
        if pod.requeue:
            where, pod.requeue = pod.requeue, NO_REQUEUE
            self._rerun(job, pod, now, restarts=0, in_place=where == IN_PLACE)
            self._follow_leader(job, pod, now, fx)
            return
        if state == PodState.SUCCEEDED or (state == PodState.KILLED and was_stopping):
            pod.done = pod.role == Role.WORKER
            return
        if state == PodState.KILLED and reason == AGENT_STOPPED:
            # Its agent stopped it on the way out (stopPodsOnExit, arranger dev): nothing of
            # the pod failed, so it runs again, as an eviction does, with no restart counted.
            message = f"{pod.name} stopped with the agent on {pod.node}; it runs again"
            fx.event(now, "Requeued", message, job, pod.name)
            self._rerun(job, pod, now, restarts=0)
            self._follow_leader(job, pod, now, fx)
            return
        if endings.start_failure(pod):  # it would fail the same way again: no restart, no back-off
            self._never_starts(job, pod, now, fx)
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
        self._touch_job(job, fx)
        ended, limit = f"{pod.name} {state.lower()}{endings.exit_text(pod)}", job.spec.restart_limit
        fx.event(now, "Restarting", f"{ended}; restart {restarts} of {limit}", job, pod.name)
        self._rerun(job, pod, now, restarts)
        self._follow_leader(job, pod, now, fx)

    def _never_starts(self, job: JobRecord, pod: PodRecord, now: float, fx: Effects) -> None:
        """_never_starts: a pod whose program can never start is done (a leader's job then
        fails); a worker spends its set's restarts, as if restartLimit were used up."""
        pod.done = True
        if pod.role == Role.WORKER:
            used = job.set_restarts.get(pod.worker_set, 0)
            job.set_restarts[pod.worker_set] = max(used, job.spec.restart_limit)
            self._touch_job(job, fx)
            message = f"{endings.why_not_started(pod)}; set {pod.worker_set} has no restarts left"
            fx.event(now, "WorkerFailed", message, job, pod.name)

    def _follow_leader(self, job: JobRecord, pod: PodRecord, now: float, fx: Effects) -> None:
        """_follow_leader: a leader that must move to another node sends the job to
        Rescheduling; its running workers are stopped to start again with the new address."""
        if pod.role != Role.LEADER or pod.state != PodState.PENDING or job.stage == Stage.PENDING:
            return
        if evictions.leader_gone(self, job, now, fx):  # under notice: it is evicted instead
            return
        message = "the leader moves to another node; workers restart with its new address"
        self.set_stage(job, Stage.RESCHEDULING, "LeaderMoved", message, now, fx)
        job.leader_address = ""
        for worker in job.workers():
            if worker.live:
                worker.requeue = IN_PLACE
                self.kill(worker, "Rescheduling", False, fx)

    def _rerun(
        self, job: JobRecord, pod: PodRecord, now: float, restarts: int, in_place: bool = True
    ) -> None:
        """_rerun prepares the pod's next attempt: in place on its node (keeping its ports) when
        that node is still Ready and not cordoned, else (or when not `in_place`) back to
        Pending for the scheduler."""
        pod.attempt += 1
        pod.exit_code, pod.start_time, pod.finish_time = None, None, None
        backoff = 0.0
        if restarts > 0:
            backoff = min(
                self.config.backoff_initial_s * 2 ** (restarts - 1), self.config.backoff_max_s
            )
        pod.not_before = now + backoff
        node = self.nodes.get(pod.node)
        if in_place and node is not None and node.state == NodeState.READY and not node.cordoned:
            pod.state = PodState.PLACED
        else:
            self.unplace(pod)

    def unplace(self, pod: PodRecord) -> None:
        pod.state, pod.node, pod.gpus, pod.ports = PodState.PENDING, "", (), {}

    def _finish(
        self, job: JobRecord, stage: Stage, reason: str, message: str, now: float, fx: Effects
    ) -> None:
        """_finish ends the job, applies cleanPodPolicy to its pods and writes its history
        record (with the same commit): usage is counted up to now, whatever still runs."""
        self.set_stage(job, stage, reason, message, now, fx)
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
        evictions.job_ended(job, fx)
        for pod in job.pods.values():
            pod.done = True
            if pod.state in (PodState.PENDING, PodState.PLACED):
                pod.state, pod.reason = PodState.KILLED, "JobFinished"
                fx.pods.add(pod.uid)
            elif pod.live and policy != CleanPodPolicy.NONE:
                self.kill(pod, "JobFinished", policy == CleanPodPolicy.ALL, fx)
            elif pod.node and policy == CleanPodPolicy.ALL and pod.state.terminal:
                fx.kills.append(KillOrder(pod.node, pod.uid, pod.attempt, 0.0, "Cleanup", True))
        fx.schedule = True

    def _reap(self, job: JobRecord, now: float, fx: Effects) -> None:
        """_reap stops a deleted job's processes and, once none is left, forgets the job."""
        for pod in job.pods.values():
            pod.done = True
            if pod.state in (PodState.PENDING, PodState.PLACED):
                pod.state = PodState.KILLED
            elif pod.live:
                self.kill(pod, "JobDeleted", True, fx)
        if any(p.live for p in job.pods.values()):
            return
        self.withdraw(job)
        fx.removed[job.id] = job
        fx.purges.append(job.id)
        fx.schedule = True

    # Small steps.

    def _launchable(self, pod: PodRecord, now: float) -> bool:
        node = self.nodes.get(pod.node)
        return node is not None and node.connected and pod.not_before <= now and not pod.requeue

    def _launch(self, job: JobRecord, pod: PodRecord, now: float, fx: Effects) -> None:
        node = self.nodes[pod.node]
        pod.state, pod.stopping, pod.reason = PodState.LAUNCHING, False, ""
        if launched(job, pod, now):
            self._touch_job(job, fx)
        fx.pods.add(pod.uid)
        grace = self.config.preemption_grace(job.spec)
        fx.launches.append(launch_order(job, pod, node, self.config.kill_grace_s, grace))

    def kill(
        self,
        pod: PodRecord,
        reason: str,
        remove_scratch: bool,
        fx: Effects,
        grace_s: float | None = None,
    ) -> None:
        if pod.stopping:
            return
        pod.stopping = True
        fx.pods.add(pod.uid)
        grace = self.config.kill_grace_s if grace_s is None else grace_s
        fx.kills.append(KillOrder(pod.node, pod.uid, pod.attempt, grace, reason, remove_scratch))

    def grace_of(self, job: JobRecord) -> float:
        return self.config.preemption_grace(job.spec)

    def notice_of(self, job: JobRecord) -> float:
        return self.config.eviction_notice(job.spec)

    def set_stage(
        self, job: JobRecord, stage: Stage, reason: str, message: str, now: float, fx: Effects
    ) -> None:
        job.stage, job.reason, job.message = stage, reason, message
        self._touch_job(job, fx)
        fx.event(now, stage.value, f"{reason}: {message}" if message else reason, job)

    def _touch_job(self, job: JobRecord, fx: Effects) -> None:
        fx.jobs.add(job.id)
