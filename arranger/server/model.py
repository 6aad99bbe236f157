"""model holds the server's working copy of jobs, pods and nodes (mutable records).

The controller owns these records; the store persists them; the snapshot builder reads them.
Times are unix seconds (floats) from the server's clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from arranger.sched import GpuShare
from arranger.sched.snapshot import SHARES_ENFORCED, SHARES_LOST, SHARES_PROMISED
from arranger.spec import JobSpec, PodSlot
from arranger.states import NodeState, PodState, Role, ScheduleState, Stage

NO_REQUEUE, IN_PLACE, SCHEDULER = 0, 1, 2


@dataclass
class PodRecord:
    """PodRecord is one pod and the state of its current attempt.

    A pod with `node` set and a state that holds resources counts against that node. `done`
    means it will never run again (it succeeded, ran out of restarts, or its job ended).
    `stopping` means a kill was sent for the current attempt. `requeue` means the attempt is
    being stopped to run again without counting a restart: IN_PLACE on the same node (its job
    is rescheduling around a moved leader), or SCHEDULER to be placed anew (evicted, drained).
    """

    uid: str
    job_id: str
    name: str
    role: Role
    worker_set: str
    index: int
    rank: int
    in_minimum: bool
    state: PodState = PodState.PENDING
    attempt: int = 0
    node: str = ""
    gpus: tuple[GpuShare, ...] = ()
    exit_code: int | None = None
    reason: str = ""
    pid: int = 0
    ports: dict[str, int] = field(default_factory=dict)
    start_time: float | None = None
    finish_time: float | None = None
    not_before: float = 0.0
    stopping: bool = False
    requeue: int = 0  # NO_REQUEUE, IN_PLACE or SCHEDULER
    done: bool = False
    held_since: float | None = None  # when this attempt's launch was ordered, until charged
    # Under an eviction notice (kept in memory only: a restarted server decides again): when
    # the eviction's SIGTERM is due, and why it was decided.
    evict_at: float | None = None
    evict_why: str = ""
    # When this attempt last reported progress (see stalls; server clock, memory only).
    progress_at: float | None = None
    # Since when its GPUs read idle, once that has lasted idleGpuMinutes (see idle_gpus;
    # memory only); None: not idle.
    gpu_idle_since: float | None = None

    def end_notice(self) -> None:
        """end_notice: the pod is no longer under an eviction notice."""
        self.evict_at, self.evict_why = None, ""

    @property
    def leaving(self) -> bool:
        """leaving: the pod holds room that is to come free (stopped, or under an eviction
        notice), not to run again where it is."""
        return (self.stopping and self.requeue != IN_PLACE) or self.evict_at is not None

    @property
    def live(self) -> bool:
        """live: a process may exist for this pod (launch sent and no end reported)."""
        return self.state in (PodState.LAUNCHING, PodState.RUNNING)


@dataclass
class JobRecord:
    """JobRecord is a job: its spec, the controller's stage and the scheduler's verdict."""

    id: str
    spec: JobSpec
    spec_json: str
    submit_time: float
    pods: dict[str, PodRecord] = field(default_factory=dict)
    stage: Stage = Stage.PENDING
    schedule_state: ScheduleState = ScheduleState.UNSCHEDULED
    reason: str = ""
    message: str = ""
    start_time: float | None = None
    finish_time: float | None = None
    leader_restarts: int = 0
    set_restarts: dict[str, int] = field(default_factory=dict)
    retries: dict[str, int] = field(default_factory=dict)  # exit-code retries: "" the leader's
    terminating: bool = False
    deleted: bool = False
    infeasible_since: float | None = None
    leader_address: str = ""
    waiting_since: float | None = None  # None: since submit_time
    owner: str = ""  # the user who submitted it ("": submitted before jobs had owners)
    stopped_by: str = ""  # the user whose stop ended it
    nodes_used: list[str] = field(default_factory=list)  # every node it launched a pod on
    cpu_core_s: float = 0.0  # usage so far, of attempts that ended (arranger.server.history)
    memory_gib_s: float = 0.0
    gpu_s: float = 0.0
    # When its learner last confirmed a checkpoint (server clock; None: never): of otherwise
    # equal victims, the scheduler evicts the one that loses least work first.
    checkpoint_time: float | None = None
    # Held out of scheduling until the jobs its spec.dependsOn names have ended as it wants
    # (see dependencies), or until its experiment's maxParallel lets it start (see turns);
    # derived from the records, never stored.
    waiting: bool = False
    experiment: str = ""  # the id of the experiment it is a member of ("": none)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def active(self) -> bool:
        """active: the job still runs or waits to (not deleted, finished or being stopped)."""
        return not self.deleted and not self.stage.finished and not self.terminating

    @property
    def deadline(self) -> float | None:
        """deadline: when an active job that started (past Pending) has run for its
        maxRuntimeSeconds; None without a limit or while it does not run."""
        limit = self.spec.max_runtime_s
        if limit is None or self.start_time is None or self.stage == Stage.PENDING:
            return None
        return self.start_time + limit if self.active else None

    @property
    def leader(self) -> PodRecord:
        return next(iter(self.pods.values()))

    def workers(self) -> list[PodRecord]:
        """workers: the workers wanted now (those a scale-down removed are left out)."""
        wanted = {ws.name: ws.counts for ws in self.spec.worker_sets}
        return [
            p
            for p in self.pods.values()
            if p.role == Role.WORKER and p.index < wanted.get(p.worker_set, 0)
        ]


@dataclass
class ExperimentRecord:
    """ExperimentRecord: a sweep submitted once (see arranger.sweep): its spec as submitted,
    and its members, ordinary jobs, by index (`members[i]` is the id of job NAME-i). Written
    once, when submitted; it goes from the store with its last member's row. It is deleted
    once every member is (its name is then free)."""

    id: str
    spec: JobSpec  # with its sweep
    spec_json: str
    submit_time: float
    owner: str
    members: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name


def new_pods(job_id: str, spec: JobSpec) -> dict[str, PodRecord]:
    """new_pods creates a job's pods in declared order: leader first, then workers by rank."""
    minimum = spec.minimum_ranks()
    gang = spec.basic_policy == "Gang"
    pods: dict[str, PodRecord] = {}
    for slot in spec.pod_slots():
        helper = spec.is_auxiliary(slot.worker_set)  # never in the gang minimum
        in_min = slot.role == Role.LEADER or (gang and not helper) or slot.rank in minimum
        pods[slot.name] = _pod(job_id, slot, in_min)
    return pods


def new_pod(job_id: str, spec: JobSpec, worker_set: str, index: int) -> PodRecord:
    """new_pod: worker `index` of the set, as scaling adds it (outside the gang minimum)."""
    rank = spec.rank_of(worker_set, index)
    template = spec.template_of(worker_set)
    slot = PodSlot(
        f"{spec.name}-{worker_set}-{index}", Role.WORKER, worker_set, index, rank, template
    )
    return _pod(job_id, slot, False)


def _pod(job_id: str, slot: PodSlot, in_minimum: bool) -> PodRecord:
    rank = slot.rank if slot.role == Role.WORKER else -1
    return PodRecord(
        uid=f"{job_id}/{slot.name}",
        job_id=job_id,
        name=slot.name,
        role=slot.role,
        worker_set=slot.worker_set,
        index=slot.index,
        rank=rank,
        in_minimum=in_minimum,
    )


@dataclass
class GpuRecord:
    """GpuRecord is one GPU of a node as its agent reported it. `problem` says why the GPU is
    unhealthy ("": it is not), as its agent last said: the scheduler places nothing more on
    it, and the pods on it run on. It is a live fact of the agent, never stored (a restarted
    server knows it when the agent registers again), and an agent that restarts starts over
    with every GPU healthy."""

    index: int
    uuid: str
    model: str
    memory_bytes: int
    fake: bool = False
    problem: str = ""


@dataclass(frozen=True)
class GpuSharing:
    """GpuSharing is what a node's agent holds pods to of their GPU grants: `enforced`, a share
    of a GPU is held by a limit on its memory and compute; `isolation`, a plain-process pod can
    open the device nodes of its own GPUs only; `isolation_detail`, how that filter is attached
    or why there is none."""

    enforced: bool = False
    isolation: bool = False
    isolation_detail: str = ""


CLOCK_SLACK_S = 1.0  # node clock offsets below this are taken as none (see server_time)


@dataclass
class NodeRecord:
    """NodeRecord is a machine with an agent.

    A node takes new pods only when it is Ready, its agent is connected and it is not cordoned.
    `last_seen` is when its agent was last heard from; after nodeTimeout it becomes NotReady.
    `gpu_sharing` is what its agent last registered of GPU sharing (None: an older agent that
    does not say). Like `cpu_percent` and `memory_used_bytes` it is a live fact of the agent,
    kept in memory only, never stored: after a server restart it is None until the agent
    registers again.
    """

    name: str
    address: str
    cpu_milli: int
    memory_bytes: int
    gpus: list[GpuRecord] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    state: NodeState = NodeState.READY
    connected: bool = False
    cordoned: bool = False
    last_seen: float = 0.0
    agent_version: str = ""
    runtimes: list[str] = field(default_factory=list)
    cpu_percent: float = 0.0
    memory_used_bytes: int = 0
    gpu_sharing: GpuSharing | None = None
    # Whether the agent holds GPU shares to their limits now, as its last heartbeat said (None:
    # as it registered): an agent that enforces shares says false while its enforcement fails.
    shares_held: bool | None = None
    clock_offset: float | None = None  # its clock minus the server's (None: not measured)
    agent_id: str = ""  # the agent that holds its name (see node_holders; "": none known)

    @property
    def shares(self) -> str:
        """shares: how the node holds a pod to its share of a GPU (arranger.sched.snapshot:
        enforced, promised, or lost while an enforcing agent's enforcement fails)."""
        enforcing = self.gpu_sharing is not None and self.gpu_sharing.enforced
        held = enforcing if self.shares_held is None else self.shares_held
        if held:
            return SHARES_ENFORCED
        return SHARES_LOST if enforcing else SHARES_PROMISED

    def server_time(self, agent_time: float | None, now: float) -> float | None:
        """server_time: a time the node's agent reported, by the server's clock (the
        measured offset taken off where it is at least CLOCK_SLACK_S; never after `now`),
        None for none. A smaller offset is within what one message's delay adds to the
        measure: taken off, it would only reorder pods of nodes whose clocks agree."""
        if not agent_time:
            return None
        if self.clock_offset is None or abs(self.clock_offset) < CLOCK_SLACK_S:
            return min(agent_time, now)
        return min(agent_time - self.clock_offset, now)

    @property
    def schedulable(self) -> bool:
        return self.state == NodeState.READY and self.connected and not self.cordoned

    @property
    def runs_images(self) -> bool:
        """runs_images: its agent reported a container runtime (a runtime is reported as
        "<kind> (<details>)", "podman 4.3.1 (runc)")."""
        return any(r.split(" ", 1)[0] in CONTAINER_RUNTIMES for r in self.runtimes)


CONTAINER_RUNTIMES = frozenset({"podman"})


@dataclass(frozen=True)
class EventRecord:
    """EventRecord is one line of the append-only history."""

    time: float
    kind: str
    message: str
    job_id: str = ""
    job_name: str = ""
    pod: str = ""
    seq: int = field(default=0, compare=False)  # its row's id in the store (0: not read from it)
