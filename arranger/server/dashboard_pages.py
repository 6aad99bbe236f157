"""dashboard_pages: what each dashboard page shows, read from the controller's view.

Pure: a view (and the caller) in, plain rows out; the templates only lay them out. What a
caller may see follows the API's rules (access): every job's stage, owner, queue and reasons
are public; a job's command line and logs are its owner's and admins'.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from arranger.identity import Principal
from arranger.sched import Res
from arranger.server.access import may_read_private
from arranger.server.convert import live_message
from arranger.server.history import has_record, outcome_of
from arranger.server.model import JobRecord, NodeRecord
from arranger.server.usage import Sample, UsageBook
from arranger.server.view import ClusterView
from arranger.states import Stage
from arranger.sweep import experiment_of

MAX_JOBS_SHOWN = 2_000  # the jobs page shows the newest this many that match


@dataclass(frozen=True)
class GpuCell:
    """GpuCell: one GPU and the jobs holding shares of it (thousandths); `problem`: why it is
    unhealthy ("": it is not)."""

    index: int
    model: str
    fake: bool
    holders: tuple[tuple[str, int], ...]  # (job name, thousandths), largest first
    problem: str = ""
    unused: tuple[str, ...] = ()  # the holders whose pods leave it idle (see idle_gpus)

    @property
    def used(self) -> int:
        return sum(milli for _, milli in self.holders)

    @property
    def state(self) -> str:
        """state: unhealthy (it takes no pods, whoever holds it), else idle (no pod holds
        it), shared (pods hold part of it) or full."""
        if self.problem:
            return "unhealthy"
        return "idle" if self.used == 0 else "full" if self.used >= 1000 else "shared"


@dataclass(frozen=True)
class NodeCard:
    name: str
    state: str
    schedulable: bool
    cordoned: bool
    cpu: tuple[float, float]  # (allocated, capacity) cores
    memory: tuple[int, int]  # (allocated, capacity) bytes
    gpus: tuple[GpuCell, ...]
    pods: int


@dataclass(frozen=True)
class ClusterPage:
    nodes: tuple[NodeCard, ...]
    gpu_states: dict[str, int]  # over Ready nodes: idle, shared, full, unhealthy
    fragmented: float  # free parts of shared GPUs, in GPUs
    jobs_by_stage: dict[str, int]
    unused: int = 0  # GPUs held by pods that leave them idle (see idle_gpus)


@dataclass(frozen=True)
class JobRow:
    id: str
    name: str
    owner: str
    queue: str
    priority: int
    stage: str
    schedule_state: str
    reason: str
    message: str
    submit_time: float
    start_time: float | None
    finish_time: float | None
    workers: tuple[int, int]  # (running, declared)
    outcome: str = ""  # how it ended (see history.outcome_of); "": it has not
    experiment: str = ""  # the id of the experiment it is a member of ("": none)
    experiment_name: str = ""
    member: int = 0  # its index in that experiment


@dataclass(frozen=True)
class PodRow:
    name: str
    role: str
    node: str
    state: str
    attempt: int
    gpus: str
    exit_code: int | None
    reason: str
    start_time: float | None
    finish_time: float | None
    usage: Sample | None = None  # the latest sample of its live attempt


@dataclass(frozen=True)
class JobPage:
    job: JobRow
    pods: tuple[PodRow, ...]
    private: bool  # the caller may see the command lines and the logs
    commands: dict[str, str] = field(default_factory=dict)  # pod template -> command line


@dataclass(frozen=True)
class QueueRow:
    name: str
    weight: float
    pending: int
    running: int
    allocated: Res
    deserved: Res


def cluster_page(view: ClusterView) -> ClusterPage:
    """cluster_page: every node and GPU with what holds it; a walk over nodes and jobs."""
    nodes = []
    gpu_states = {"idle": 0, "shared": 0, "full": 0, "unhealthy": 0}
    fragmented = 0
    unused = 0
    for node in view.nodes():
        card = _node_card(view, node)
        nodes.append(card)
        unused += sum(1 for gpu in card.gpus if gpu.unused)
        if node.state.value == "Ready":
            for gpu in card.gpus:
                gpu_states[gpu.state] += 1
                if gpu.state == "shared":
                    fragmented += 1000 - gpu.used
    stages: dict[str, int] = {}
    for job in view.jobs():
        if not job.deleted:
            stages[job.stage.value] = stages.get(job.stage.value, 0) + 1
    return ClusterPage(tuple(nodes), gpu_states, fragmented / 1000, stages, unused)


def _node_card(view: ClusterView, node: NodeRecord) -> NodeCard:
    on = view.held_on(node.name)
    holders = on.gpus
    unused: dict[int, set[str]] = {}  # GPU index -> the jobs whose pods leave it idle
    for job, pod in view.pods_on(node.name):
        if pod.gpu_idle_since is not None:
            for share in pod.gpus:
                unused.setdefault(share.index, set()).add(job.name)
    gpus = tuple(
        GpuCell(
            gpu.index,
            gpu.model,
            gpu.fake,
            tuple(sorted(holders.get(gpu.index, {}).items(), key=lambda h: -h[1])),
            gpu.problem,
            tuple(sorted(unused.get(gpu.index, ()))),
        )
        for gpu in node.gpus
    )
    return NodeCard(
        node.name,
        node.state.value,
        node.schedulable,
        node.cordoned,
        (on.res.cpu_milli / 1000, node.cpu_milli / 1000),
        (on.res.memory_bytes, node.memory_bytes),
        gpus,
        on.pods,
    )


def job_row(job: JobRecord) -> JobRow:
    spec = job.spec
    workers = [pod for pod in job.pods.values() if pod.worker_set]
    running = sum(pod.state.value == "Running" for pod in workers)
    return JobRow(
        job.id,
        job.name,
        job.owner,
        spec.queue,
        spec.priority,
        job.stage.value,
        job.schedule_state.value,
        job.reason,
        live_message(job, running),  # with its pods found stalled or idle, as `list` says
        job.submit_time,
        job.start_time,
        job.finish_time,
        (running, len(workers)),
        outcome_of(job.stage.value, job.reason, job.deleted and not job.stage.finished)
        if has_record(job)
        else "",
        job.experiment,
        experiment_of(spec) if job.experiment else "",
        member_index(job),
    )


def member_index(job: JobRecord) -> int:
    """member_index: the job's index in its experiment (0 if it is no member)."""
    sweep = job.spec.sweep
    return sweep.member if sweep is not None and sweep.member is not None else 0


def job_rows(
    view: ClusterView, stage: str = "", owner: str = "", fold: bool = False
) -> list[JobRow]:
    """job_rows: the jobs not deleted, newest first (at most MAX_JOBS_SHOWN), of a stage
    ("active": not finished) and owner when given; with `fold`, no experiment's members
    (dashboard_experiments lists their experiments)."""
    rows: list[JobRow] = []
    for job in reversed(list(view.listed(owner=owner or None))):
        if fold and job.experiment:
            continue
        if stage == "active" and job.stage.finished:
            continue
        if stage not in ("", "active", job.stage.value):
            continue
        rows.append(job_row(job))
        if len(rows) == MAX_JOBS_SHOWN:
            break
    return rows


def job_page(job: JobRecord, caller: Principal, usage: UsageBook) -> JobPage:
    private = may_read_private(caller, job)
    pods = tuple(
        PodRow(
            pod.name,
            "leader" if not pod.worker_set else pod.worker_set,
            pod.node,
            pod.state.value,
            pod.attempt,
            ", ".join(
                f"{s.index}" + ("" if s.milli >= 1000 else f" ({s.milli / 10:g}%)")
                for s in pod.gpus
            ),
            pod.exit_code,
            pod.reason,
            pod.start_time,
            pod.finish_time,
            _sample(usage, pod.uid, pod.attempt),
        )
        for pod in job.pods.values()
    )
    commands = {}
    if private:
        spec = job.spec
        commands["leader"] = " ".join([*spec.leader.command, *spec.leader.args])
        for ws in spec.worker_sets:
            commands[ws.name] = " ".join([*ws.template.command, *ws.template.args])
    return JobPage(job_row(job), pods, private, commands)


def queue_rows(view: ClusterView, deserved: dict[str, Res]) -> list[QueueRow]:
    """queue_rows: each queue's weight, jobs and what they hold; a walk over every job."""
    loads = view.queue_loads()
    rows = []
    for q in view.queues():
        load = loads[q.name]
        pending = load.stages.get(Stage.PENDING.value, 0)
        unfinished = sum(n for stage, n in load.stages.items() if not Stage(stage).finished)
        rows.append(
            QueueRow(
                q.name,
                q.weight,
                pending,
                unfinished - pending,
                load.held,
                deserved.get(q.name, Res()),
            )
        )
    return rows


def _sample(usage: UsageBook, uid: str, attempt: int) -> Sample | None:
    sample = usage.latest.get(uid)
    return sample if sample is not None and sample.attempt == attempt else None
