"""controller drives every job through its stages (DESIGN §3): a pure state machine.

Stimuli (a submit, a plan, a pod report, a node joining or going silent, the clock) mutate the
records and return Effects; the shell stores them and then sends the orders. The controller
never does I/O and never reads a clock: `now` comes with every stimulus.

The controller takes the stimuli and holds the records; what they do is told apart by concept:
a job's way through its stages in lifecycle (after any stimulus touching a job, its
`reconcile` looks at the whole job and decides, level triggered, so the same state always
leads to the same orders), the plan's in plan_apply, evictions in evictions, scaling in
scaling, and what agents and operators do to nodes in node_events. Each stimulus is tagged
with an id, and the changes of stage and state it made are kept (transitions; `story`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence

from arranger.sched import Plan
from arranger.sched.plan import Claim, Reservation
from arranger.server import (
    clock_steps,
    dependencies,
    evictions,
    experiments,
    history,
    lifecycle,
    plan_apply,
    scaling,
    stalls,
)
from arranger.server.controller_config import ControllerConfig
from arranger.server.effects import Effects, KillOrder
from arranger.server.listing import JobOrder, key_of
from arranger.server.model import ExperimentRecord, JobRecord, NodeRecord, PodRecord, new_pods
from arranger.server.node_events import NodeBook
from arranger.server.nodes import NodeRegistration, PodReport
from arranger.server.queues import DEFAULT, QueueRecord
from arranger.server.transitions import Transition, TransitionLog, stimulus
from arranger.server.view import ClusterView
from arranger.spec import DEFAULT_QUEUE, JobSpec
from arranger.states import PodState, Stage


class Controller:
    """Controller holds every job, pod and node record and applies stimuli to them; `view`
    answers every query of them from outside. `order` holds every job of `jobs` in listing
    order (submit time, then id). Node stimuli go to `node_book`, which owns `nodes` and takes
    its job steps here (it is its JobSteps). `node_timeout_s` is config's until the server
    stretches it as the cluster grows (see heartbeats). `transitions` keeps the recent changes
    of stage and state, by stimulus (`story`)."""

    def __init__(self, config: ControllerConfig | None = None) -> None:
        self.config = config or ControllerConfig()
        self.node_timeout_s = self.config.node_timeout_s
        self.jobs: dict[str, JobRecord] = {}
        self.waiting: set[str] = set()  # jobs held for their dependencies (see dependencies)
        self.waiters: dict[str, set[str]] = {}  # a job waited for -> the held jobs waiting
        self.experiments: dict[str, ExperimentRecord] = {}  # by id (see experiments)
        self.experiment_names: dict[str, list[str]] = {}  # name -> those not deleted
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
            experiments=self.experiments,
            experiment_names=self.experiment_names,
        )
        self.transitions = TransitionLog(self.jobs, self.config.story_length)

    # Names.

    def remember_name(self, job: JobRecord) -> None:
        """remember_name lets the job's name reach it (kept in listing order), and its
        experiment's name its experiment (a member not deleted keeps it named)."""
        exp = self.experiments.get(job.experiment) if job.experiment else None
        if exp is not None:
            experiments.named(self, exp)
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

    @stimulus("restore")
    def restore(
        self,
        jobs: list[JobRecord],
        nodes: list[NodeRecord],
        now: float,
        queues: Sequence[QueueRecord] = (),
        stored_experiments: Sequence[ExperimentRecord] = (),
    ) -> Effects:
        """restore loads stored records after a restart. Every node is given nodeTimeout from
        now to reconnect before its pods are declared Lost; none takes new pods until it does."""
        for queue in queues:
            self.queues[queue.name] = queue
        self.node_book.restore(nodes, now)
        experiments.restore(self, jobs, stored_experiments)
        for job in jobs:
            self.put_back_job(job)  # named, with their experiments
        fx = Effects()
        for job in jobs:
            if job.deleted:
                self.reconcile(job, now, fx)  # reaped now if nothing of it still runs
            elif job.spec.depends_on:  # again, every job known: what it waits for is there
                dependencies.hold_as_stored(self, job, now, fx)
        for exp in list(self.experiments.values()):
            experiments.take_turns(self, exp, now, fx)
        return fx

    def put_back_job(self, job: JobRecord) -> None:
        """put_back_job makes a job as stored known: by id, in listing order, by its name
        (unless deleted), and on the nodes its pods are placed on."""
        self.jobs[job.id] = job
        self.order.add(job)
        self.transitions.know(job)
        self.hold_as_stored(job)
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

    @stimulus("submit")
    def submit(
        self,
        job_id: str,
        spec: JobSpec,
        spec_json: str,
        now: float,
        owner: str = "",
        experiment: str = "",
    ) -> tuple[JobRecord, Effects]:
        """submit adds a job. Its submit time is `now`, or just after the newest job's if the
        clock has not moved past it: each new job comes last in listing order, so a client
        paging through the jobs meets those submitted meanwhile on a later page."""
        newest = self.order.newest()
        if newest is not None and now <= newest[0]:
            now = math.nextafter(newest[0], math.inf)
        job = JobRecord(
            id=job_id,
            spec=spec,
            spec_json=spec_json,
            submit_time=now,
            owner=owner,
            experiment=experiment,
        )
        job.pods = new_pods(job_id, spec)
        job.reason, job.message = "Submitted", "waiting for the scheduler"
        self.jobs[job_id] = job
        self.order.add(job)
        self.remember_name(job)
        fx = Effects(schedule=True)
        fx.jobs.add(job.id)
        fx.pods.update(p.uid for p in job.pods.values())
        pods = len(job.pods)
        fx.event(now, "Submitted", f"{pods} pods, priority {spec.priority}", job)
        dependencies.hold(self, job, now, fx)
        return job, fx

    def hold_as_stored(self, job: JobRecord) -> None:
        """hold_as_stored holds a job read back from the store as it was held (its hold is
        derived, never stored; see dependencies and experiments)."""
        dependencies.hold_as_stored(self, job, 0.0, None)
        experiments.hold_as_stored(self, job)

    def settle(self, fx: Effects, now: float) -> None:
        """settle: the jobs waiting for those that ended in `fx` (see dependencies.settle),
        then the turns of the experiments touched (experiments.settle)."""
        dependencies.settle(self, fx, now)
        experiments.settle(self, fx, now)

    @stimulus("submit-experiment")
    def submit_experiment(
        self, exp: ExperimentRecord, specs: Sequence[tuple[str, JobSpec, str]], now: float
    ) -> Effects:
        """submit_experiment adds an experiment and its members, (id, spec, spec's JSON)
        each, by index (see experiments.submit)."""
        return experiments.submit(self, exp, specs, now)

    def withdraw(self, job: JobRecord) -> None:
        """withdraw forgets a job as if never submitted: its submit could not be stored, or
        retention prunes it."""
        self.jobs.pop(job.id, None)
        self.order.remove(job)
        self.forget_name(job)
        self.transitions.forget(job)
        dependencies.forget(self, job)
        if job.experiment:
            experiments.forget(self, job)

    @stimulus("stop")
    def stop(self, job: JobRecord, now: float, by: str = "") -> Effects:
        """stop ends the job (it Succeeds, reason Stopped); `by` is the user who asked."""
        fx = Effects()
        if not job.terminating and not job.stage.finished:
            job.terminating, job.stopped_by = True, by
            fx.jobs.add(job.id)
            fx.event(now, "StopRequested", "terminating set", job)
            self.reconcile(job, now, fx)
        return fx

    @stimulus("delete")
    def delete(self, job: JobRecord, now: float) -> Effects:
        fx = Effects(schedule=True)
        job.deleted = True
        self.forget_name(job)
        experiments.member_deleted(self, job)
        fx.jobs.add(job.id)
        fx.event(now, "Deleted", "deleted by request", job)
        if not job.stage.finished:  # a finished job has its record
            history.deleted_unfinished(job, now)
            fx.pods.update(pod.uid for pod in job.pods.values())  # charged: held no more
            fx.history.append(history.record_of(job))
            fx.ended.add(job.id)
        self.reconcile(job, now, fx)
        return fx

    @stimulus("scale")
    def scale(
        self, job: JobRecord, worker_set: str, counts: int, now: float, by: str = ""
    ) -> Effects:
        """scale changes a worker set's wanted count (see arranger.server.scaling; checked
        there by scale_problem first)."""
        return scaling.scale(self, job, worker_set, counts, now, by)

    @stimulus("confirm-checkpoint")
    def confirm_checkpoint(self, job: JobRecord, now: float) -> Effects | None:
        """confirm_checkpoint: the job's learner has checkpointed, now (see
        evictions.checkpointed); None when the job has ended."""
        return evictions.checkpointed(self, job, now)

    # Queues.

    @stimulus("put-queue")
    def put_queue(self, queue: QueueRecord, now: float) -> Effects:
        """put_queue creates or replaces a queue."""
        fx = Effects(queues={queue.name}, schedule=True)
        verb = "QueueUpdated" if queue.name in self.queues else "QueueCreated"
        self.queues[queue.name] = queue
        fx.event(now, verb, f"queue {queue.name}: weight {queue.weight:g}")
        return fx

    @stimulus("delete-queue")
    def delete_queue(self, name: str, now: float) -> Effects:
        fx = Effects(removed_queues={name}, schedule=True)
        self.queues.pop(name, None)
        fx.event(now, "QueueDeleted", f"queue {name}")
        return fx

    # Scheduler stimulus.

    @stimulus("apply-plan")
    def apply_plan(self, plan: Plan, now: float, skip: Collection[str] = ()) -> Effects:
        """apply_plan carries the plan out (see arranger.server.plan_apply)."""
        return plan_apply.apply_plan(self, plan, now, skip)

    # The clock.

    @stimulus("tick")
    def tick(self, now: float, jobs: Iterable[JobRecord] | None = None) -> Effects:
        """tick does what the time calls for (see clock_steps) in `jobs`: those that may
        still change with time (default: all)."""
        fx = Effects()
        for job in list(self.jobs.values() if jobs is None else jobs):
            clock_steps.tick(self, job, now, fx)
        return fx

    @stimulus("progress")
    def progress(self, job: JobRecord, pod_name: str, now: float) -> Effects:
        """progress: the job's pod `pod_name` reported progress through the in-job SDK (see
        stalls); nothing to write unless it was Stalled."""
        fx = Effects()
        pod = job.pods.get(pod_name)
        if pod is not None and job.active:
            first = pod.progress_at is None
            stalls.progressed(job, pod, now, fx)
            if first and pod is job.leader and pod.progress_at is not None:
                self.reconcile(job, now, fx)  # sets that start after it (startAfter)
        return fx

    def timer(self, job_id: str) -> float | None:
        """timer: the earliest time the clock alone changes the job (see clock_steps)."""
        job = self.jobs.get(job_id)
        return clock_steps.timer(job) if job is not None else None

    # Nodes (see NodeBook).

    @stimulus("node-registered")
    def node_registered(self, reg: NodeRegistration, now: float) -> Effects:
        return self.node_book.node_registered(reg, now)

    @stimulus("node-resync")
    def node_resync(self, name: str, reports: list[PodReport], now: float) -> Effects:
        return self.node_book.node_resync(name, reports, now)

    @stimulus("node-disconnected")
    def node_disconnected(self, name: str, now: float) -> Effects:
        return self.node_book.node_disconnected(name, now)

    @stimulus("seen")
    def seen(self, name: str, now: float) -> None:
        self.node_book.seen(name, now)

    @stimulus("heartbeat")
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

    @stimulus("gpu-problems")
    def gpu_problems(self, name: str, problems: Mapping[int, str], now: float) -> Effects:
        return self.node_book.gpu_problems(name, problems, now)

    @stimulus("check-nodes")
    def check_nodes(self, now: float) -> Effects:
        return self.node_book.check_nodes(now, self.node_timeout_s)

    @stimulus("pod-reports")
    def pod_reports(self, node_name: str, reports: list[PodReport], now: float) -> Effects:
        return self.node_book.pod_reports(node_name, reports, now)

    @stimulus("cordon")
    def cordon(self, name: str, cordoned: bool, now: float) -> Effects:
        return self.node_book.cordon(name, cordoned, now)

    @stimulus("drain")
    def drain(self, name: str, now: float) -> Effects:
        return self.node_book.drain(name, now)

    # Job steps: the node book's JobSteps, and the steps lifecycle, plan_apply, evictions and
    # scaling take (LifeSteps, PlanSteps, EvictionSteps, ScaleSteps).

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
        lifecycle.reconcile(self, job, now, fx)

    def leader_running(self, job: JobRecord, leader: PodRecord, now: float, fx: Effects) -> None:
        lifecycle.leader_running(self, job, leader, now, fx)

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
        lifecycle.pod_ended(self, job, pod, state, exit_code, reason, now, fx, ended_at)

    # Small steps.

    def unplace(self, pod: PodRecord) -> None:
        pod.state, pod.node, pod.gpus, pod.ports = PodState.PENDING, "", (), {}

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
        fx.jobs.add(job.id)
        fx.event(now, stage.value, f"{reason}: {message}" if message else reason, job)

    # What happened.

    def story(self, key: str) -> list[Transition]:
        """story: the recent transitions of a job (by id: its own and its pods') or of a pod
        (by uid), oldest first, each with the stimulus that made it (see transitions)."""
        return self.transitions.story(key)
