"""snapshot holds the records of the frozen view of the cluster one scheduling cycle works on
(a Snapshot, see cluster): nodes and their GPUs, jobs, their pods and requests, queues, and
the index of the jobs a cycle reads.

The server builds them from its state; the trace simulator builds them from CSV files.
Amounts are integers: milli-cores, bytes, milli-GPUs. `Snapshot.now` is the only clock the
core sees.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from arranger.sched.plan import GpuShare
from arranger.sched.resources import UNLIMITED, Res
from arranger.states import BasicPolicy, JobQueuePolicy, Role

GPU_MILLI = 1000
DEFAULT_QUEUE = "default"
NO_CAPABILITY = Res(UNLIMITED, UNLIMITED, UNLIMITED)


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """GpuInfo is one GPU of a node and the milli-GPUs already allocated on it (0..1000).

    `problem` says why the GPU is unhealthy ("": it is not): it takes no new pods, whatever
    its pods hold, and the pods on it run on (see NodeArrays).
    """

    index: int
    model: str
    used_milli: int = 0
    problem: str = ""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """NodeInfo is a node's allocatable resources and what bound pods already use.

    `schedulable` is false for nodes that are not ready or are cordoned: they take no new pods.
    `ready` is false only for nodes that are gone (NotReady); a ready node that is cordoned or
    briefly disconnected still counts when the core asks whether a job could ever fit.
    `containers`: the node can run pods that name an image.
    `shares`: how the node's agent holds a pod to its share of a GPU: ENFORCED (limits it
    cannot raise), PROMISED (none: shares are only promised) or LOST (it enforces them when
    its enforcement works, and that has failed): see SchedulerConfig.enforced_shares_only.
    """

    name: str
    cpu_milli: int
    memory_bytes: int
    gpus: tuple[GpuInfo, ...] = ()
    used_cpu_milli: int = 0
    used_memory_bytes: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    schedulable: bool = True
    ready: bool = True
    containers: bool = False
    shares: str = "promised"


SHARES_ENFORCED, SHARES_PROMISED, SHARES_LOST = "enforced", "promised", "lost"


@dataclass(frozen=True, slots=True)
class PodRequest:
    """PodRequest is a pod waiting for a node.

    `in_minimum` marks pods of the job's gang minimum: they are placed all together or not at
    all. GPU requests are whole GPUs (multiples of 1000) or a share of one GPU (1..999).
    Pods of one worker set are identical but for name and rank; the core places them as a group.
    `container`: the pod names an image, so only nodes with a container runtime take it.
    `auxiliary`: a helper role's pod, never in the minimum (not even of basicPolicy Gang).
    """

    name: str
    role: Role
    rank: int
    cpu_milli: int
    memory_bytes: int
    gpu_milli: int = 0
    gpu_type: str = ""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    in_minimum: bool = True
    worker_set: str = ""
    preferred_gpu_type: str = ""
    container: bool = False
    auxiliary: bool = False
    # Derived once: the request as a vector, the GPU models allowed (gpu_type may list
    # several, "V100M16|V100M32"; empty: any), and what makes two pods interchangeable.
    request: Res = field(init=False, repr=False, compare=False)
    gpu_models: frozenset[str] = field(init=False, repr=False, compare=False)
    shape: tuple[object, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "request", Res(self.cpu_milli, self.memory_bytes, self.gpu_milli))
        models = frozenset(m for m in self.gpu_type.split("|") if m)
        object.__setattr__(self, "gpu_models", models)
        shape = (
            self.role,
            self.worker_set,
            self.request,
            self.gpu_type,
            self.preferred_gpu_type,
            tuple(sorted(self.node_selector.items())),
            self.container,
        )
        object.__setattr__(self, "shape", shape)


@dataclass(frozen=True, slots=True)
class RunningPod:
    """RunningPod is a pod of the job that holds resources on a node: placed, starting,
    running, or being stopped (`terminating`: it still holds them until it is gone)."""

    name: str
    node: str
    request: Res
    gpus: tuple[GpuShare, ...] = ()
    role: Role = Role.WORKER
    in_minimum: bool = True
    start_time: float | None = None
    terminating: bool = False


@dataclass(frozen=True, slots=True)
class JobInfo:
    """JobInfo is a job with pods to place.

    `running` are its pods that hold resources, and `allocated` what they hold.
    `infeasible_since` is when a cycle first found the job's minimum could not fit even the
    empty cluster. `schedule_timeout_s`: a job still without its minimum that long after it
    started waiting (`waiting_since`, else submit_time) fails. `machine_group_only`: the job uses only its queue's private nodes.
    `waiting_since`: when its minimum last started waiting (submit, an eviction, its release by
    the jobs it depended on), for the schedule timeout and the starvation guard. `preemptible`: false asks not to be evicted (honoured from a configured
    priority up). `start_time`: when it last started running, and `checkpoint_time`: when its
    learner last confirmed a checkpoint (None: never), for choosing victims (least work lost).
    """

    id: str
    name: str
    queue: str
    priority: int
    submit_time: float
    pending: tuple[PodRequest, ...]
    running: tuple[RunningPod, ...] = ()
    basic_policy: BasicPolicy = BasicPolicy.BINPACK
    job_queue_policy: JobQueuePolicy = JobQueuePolicy.PRIORITY
    infeasible_since: float | None = None
    allocated: Res = Res()
    schedule_timeout_s: float | None = None
    machine_group_only: bool = False
    waiting_since: float | None = None
    preemptible: bool = True
    start_time: float | None = None
    max_runtime_s: float | None = None
    checkpoint_time: float | None = None


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """QueueInfo is a tenant's share: `weight` splits the cluster, `capability` caps it hard
    (components left UNLIMITED are not capped), and `machine_groups` are the private node
    groups its jobs may use. What the queue holds is what its jobs in the snapshot hold, plus
    `held_outside`: what its jobs outside the snapshot still hold (ended jobs whose processes
    run on under cleanPodPolicy None). `min_run_s`: its pods that have run less than this are
    not evicted by preempt or reclaim (0: no such shield)."""

    name: str
    weight: float = 1.0
    capability: Res = NO_CAPABILITY
    held_outside: Res = Res()
    machine_groups: frozenset[str] = frozenset()
    min_run_s: float = 0.0


@dataclass(frozen=True, slots=True)
class JobIndex:
    """JobIndex is what a cycle needs to know of all the snapshot's jobs, so that it looks at
    each job only when it has pods to place or is a candidate victim.

    `pending`: the jobs with pods to place, in the order of the snapshot's jobs. `held`: per
    queue, what its jobs in the snapshot hold (their `allocated`), queues holding nothing left
    out. `unlisted`: the queues of jobs whose queue the snapshot does not list, in the order
    they first appear among the jobs. `terminating`: every pod being stopped, with its job,
    in the order of the jobs and of their pods. `shapes`: how many pods of each PodShape the
    jobs have, waiting or running (the request mix MinFragment places against, by default);
    None: not counted (counted from the jobs when needed). `index_jobs` computes it all from
    the jobs.
    """

    pending: tuple[JobInfo, ...] = ()
    held: Mapping[str, Res] = field(default_factory=dict)
    unlisted: tuple[str, ...] = ()
    terminating: tuple[tuple[JobInfo, RunningPod], ...] = ()
    shapes: Mapping[PodShape, int] | None = None


# PodShape: a pod's milli-cores, milli-GPUs and allowed GPU models (empty: any).
PodShape = tuple[int, int, frozenset[str]]
ANY_MODEL: frozenset[str] = frozenset()


def pod_shapes(job: JobInfo) -> dict[PodShape, int]:
    """pod_shapes counts the job's pods by PodShape, waiting or running (the models a running
    pod was allowed are not known: any)."""
    shapes: dict[PodShape, int] = {}
    for p in job.pending:
        shape = (p.cpu_milli, p.gpu_milli, p.gpu_models)
        shapes[shape] = shapes.get(shape, 0) + 1
    for r in job.running:
        shape = (r.request.cpu_milli, r.request.gpu_milli, ANY_MODEL)
        shapes[shape] = shapes.get(shape, 0) + 1
    return shapes


def index_jobs(
    jobs: tuple[JobInfo, ...], queues: tuple[QueueInfo, ...], shapes: bool = True
) -> JobIndex:
    """index_jobs: the JobIndex of these jobs, looking at every job (and every running pod);
    the pods' shapes not counted unless `shapes`."""
    listed = {q.name for q in queues}
    nothing = Res()
    pending: list[JobInfo] = []
    held: dict[str, Res] = {}
    unlisted: dict[str, None] = {}  # an ordered set
    terminating: list[tuple[JobInfo, RunningPod]] = []
    counted: Counter[PodShape] = Counter()
    for job in jobs:
        if shapes:
            counted.update(pod_shapes(job))
        if job.pending:
            pending.append(job)
        if job.queue not in listed:
            unlisted[job.queue] = None
        if job.allocated != nothing:
            held[job.queue] = held.get(job.queue, nothing) + job.allocated
        terminating.extend((job, pod) for pod in job.running if pod.terminating)
    return JobIndex(
        tuple(pending),
        held,
        tuple(unlisted),
        tuple(terminating),
        dict(counted) if shapes else None,
    )
