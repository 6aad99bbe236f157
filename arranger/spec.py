"""spec is the validated, defaults-filled job spec the server works with (DESIGN §2).

It is built only by arranger.server.validation from a wire message, so every value here has
passed the limits documented there. Resource amounts are integers in fixed units.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace

from arranger.states import BasicPolicy, CleanPodPolicy, JobQueuePolicy, Role

DEFAULT_QUEUE = "default"
DEFAULT_PRIORITY = 5
MIN_PRIORITY, MAX_PRIORITY = 1, 10
DEFAULT_RESTART_LIMIT = 3
DEFAULT_MIN_WORKERS = 1
DEFAULT_CPU_MILLI = 1000
DEFAULT_MEMORY_BYTES = 512 * 2**20
LEADER_DEFAULT_PORT = "rpc"


# podman reads these before a colon as a transport: a file or directory on the agent's machine
# (docker-archive:/root/x.tar), or another store. A pod names images in a registry only.
IMAGE_TRANSPORTS = (
    "containers-storage",
    "dir",
    "docker-archive",
    "docker-daemon",
    "docker",
    "oci",
    "oci-archive",
    "ostree",
    "sif",
    "tarball",
)
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,511}")


def image_problem(image: str) -> str | None:
    """image_problem: why `image` is not a registry image reference podman may be given
    (`registry.example:5000/team/learner:1.2@sha256:...`), or None if it is. It must never
    read as an option, nor name a transport other than a registry (`docker://` is one)."""
    if not _IMAGE.fullmatch(image):
        return "is not an image reference (like registry.example/team/learner:1.2)"
    transport, colon, _ = image.partition(":")
    if colon and transport in IMAGE_TRANSPORTS and not image.startswith("docker://"):
        return f"names the {transport}: transport; only registry images may be run"
    return None


def env_name(name: str) -> str:
    """env_name turns a port or volume name into the suffix of its variable: `rpc-x` → `RPC_X`."""
    return name.upper().replace("-", "_").replace(".", "_")


@dataclass(frozen=True)
class Resources:
    """Resources is a pod's request: milli-cores, bytes, milli-GPUs and an optional GPU model,
    and its pids limit: the most processes and threads it may hold at once (0: the node's
    default). The pids limit is set by the agent; the scheduler does not place it."""

    cpu_milli: int = DEFAULT_CPU_MILLI
    memory_bytes: int = DEFAULT_MEMORY_BYTES
    gpu_milli: int = 0
    gpu_type: str = ""
    preferred_gpu_type: str = ""
    pids: int = 0


@dataclass(frozen=True)
class PodTemplate:
    """PodTemplate is how to run one process; `ports` are names the agent allocates numbers for."""

    command: tuple[str, ...]
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    working_dir: str = ""
    resources: Resources = Resources()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    ports: tuple[str, ...] = ()
    readiness_port: str = ""
    image: str = ""


ON_STALL = ("notify", "restart", "fail")
START_AFTER = ("", "leaderReady")


@dataclass(frozen=True)
class StallPolicy:
    """StallPolicy: a pod that reported progress and then none for `timeout_s` is Stalled
    (None: never); `on_stall` says what follows: notify (an event and a mark), restart (the
    pod, counting a restart) or fail (the job)."""

    timeout_s: float | None = None
    on_stall: str = "notify"


@dataclass(frozen=True)
class WorkerSet:
    """WorkerSet: `counts` workers wanted now, within [min_count, max_counts] (elastic when
    max_counts > counts at submit; 0 means max_counts = counts)."""

    name: str
    counts: int
    template: PodTemplate
    min_count: int = 0
    max_counts: int = 0
    retry_on_exit_codes: tuple[int, ...] = ()  # restarts that spend no restartLimit
    stall: StallPolicy = StallPolicy()
    auxiliary: bool = False  # a helper role: never in the gang minimum nor minWorkersNum
    termination_delay_s: float = 0.0  # an auxiliary set's time after the leader has ended
    start_after: str = ""  # "leaderReady": once the leader has reported (see START_AFTER)

    @property
    def most(self) -> int:
        """most: the most workers the set may have (its maxCounts)."""
        return max(self.max_counts, self.counts)


@dataclass(frozen=True)
class Volume:
    name: str
    host_path: str
    mount_path: str
    read_only: bool = False


@dataclass(frozen=True)
class Package:
    """Package: a job's shipped working directory, by the SHA-256 of its archive (64
    lowercase hex digits) and the archive's size in bytes."""

    sha256: str
    size: int


@dataclass(frozen=True)
class PodSlot:
    """PodSlot is one pod a spec declares: the leader, or worker `index` of a set with its rank."""

    name: str
    role: Role
    worker_set: str
    index: int
    rank: int
    template: PodTemplate


@dataclass(frozen=True)
class Dependency:
    """Dependency: a job this one waits for (its id, once admitted) and when that counts as met:
    succeeded, finished or failed (WHEN)."""

    job: str
    when: str = "succeeded"


WHEN = ("succeeded", "finished", "failed")
MAX_DEPENDENCIES = 32


@dataclass(frozen=True)
class Sweep:
    """Sweep: a grid of parameter values (their product, the parameters in name order, the
    last changing fastest) run once per seed 0..seeds-1 (see arranger.sweep). `max_parallel`
    members at most are unfinished and not held at once (0: no limit). Values are kept as
    the text pods see. A member's own sweep has `member` set (its index), one value of each
    parameter (its own) and its `seed`."""

    parameters: tuple[tuple[str, tuple[str, ...]], ...]
    seeds: int = 1
    max_parallel: int = 0
    member: int | None = None
    seed: int = 0

    def own_values(self) -> dict[str, str]:
        """own_values: a member's value of each parameter, `seed` and `index` (see member)."""
        values = {name: options[0] for name, options in self.parameters}
        values.update(seed=str(self.seed), index=str(self.member))
        return values

    @property
    def points(self) -> int:
        """points: how many points the grid has (1 without parameters)."""
        count = 1
        for _, values in self.parameters:
            count *= len(values)
        return count

    @property
    def size(self) -> int:
        """size: how many members the sweep makes (points x seeds)."""
        return self.points * self.seeds

    def values_of(self, index: int) -> dict[str, str]:
        """values_of: member `index`'s value of each parameter, and its `seed`."""
        point, seed = divmod(index, self.seeds)
        values: dict[str, str] = {}
        for name, options in reversed(self.parameters):
            point, at = divmod(point, len(options))
            values[name] = options[at]
        ordered = {name: values[name] for name, _ in self.parameters}
        ordered["seed"] = str(seed)
        return ordered


@dataclass(frozen=True)
class JobSpec:
    """JobSpec is a whole job as submitted, with defaults filled in."""

    name: str
    leader_name: str
    leader: PodTemplate
    worker_sets: tuple[WorkerSet, ...]
    queue: str = DEFAULT_QUEUE
    labels: Mapping[str, str] = field(default_factory=dict)
    priority: int = DEFAULT_PRIORITY
    restart_limit: int = DEFAULT_RESTART_LIMIT
    min_workers_num: int = DEFAULT_MIN_WORKERS
    clean_pod_policy: CleanPodPolicy = CleanPodPolicy.ALL
    job_queue_policy: JobQueuePolicy = JobQueuePolicy.PRIORITY
    basic_policy: BasicPolicy = BasicPolicy.BINPACK
    volumes: tuple[Volume, ...] = ()
    schedule_timeout_s: float | None = None
    machine_group_only: bool = False
    preemptible: bool = True
    preemption_grace_s: float | None = None
    max_runtime_s: float | None = None
    package: Package | None = None
    eviction_notice_s: float = 0.0
    depends_on: tuple[Dependency, ...] = ()
    sweep: Sweep | None = None  # an experiment's; a member's own values (Sweep.member set)
    leader_retry_on_exit_codes: tuple[int, ...] = ()  # restarts that spend no restartLimit
    leader_stall: StallPolicy = StallPolicy()

    @property
    def num_workers(self) -> int:
        """num_workers: the workers wanted now, over all sets (ARRANGER_NUM_WORKERS)."""
        return sum(ws.counts for ws in self.worker_sets)

    def worker_set(self, name: str) -> WorkerSet | None:
        return next((ws for ws in self.worker_sets if ws.name == name), None)

    def wants(self, worker_set: str, index: int) -> bool:
        """wants: whether worker `index` of the set is wanted now (the leader, "", always)."""
        if not worker_set:
            return True
        ws = self.worker_set(worker_set)
        return ws is not None and index < ws.counts

    def rank_of(self, worker_set: str, index: int) -> int:
        """rank_of: a worker's global rank, the earlier sets' maxCounts added up plus its
        index: stable while it stays, dense when no set is elastic."""
        first = 0
        for ws in self.worker_sets:
            if ws.name == worker_set:
                return first + index
            first += ws.most
        raise KeyError(worker_set)

    def scaled(self, worker_set: str, counts: int) -> JobSpec:
        """scaled: this spec with the set's wanted count changed (checked by the caller)."""
        sets = tuple(
            replace(ws, counts=counts, max_counts=ws.most) if ws.name == worker_set else ws
            for ws in self.worker_sets
        )
        return replace(self, worker_sets=sets)

    @property
    def counted_workers(self) -> int:
        """counted_workers: the workers wanted now of the sets that are not auxiliary (those
        minWorkersNum and TooFewWorkers count)."""
        return sum(ws.counts for ws in self.worker_sets if not ws.auxiliary)

    def is_auxiliary(self, worker_set: str) -> bool:
        ws = self.worker_set(worker_set) if worker_set else None
        return ws is not None and ws.auxiliary

    @property
    def wind_down_s(self) -> float:
        """wind_down_s: how long the auxiliary sets may run on once the leader has ended."""
        return max((ws.termination_delay_s for ws in self.worker_sets if ws.auxiliary), default=0)

    @property
    def required_workers(self) -> int:
        """required_workers: the workers the job needs running: minWorkersNum, or every
        worker of its sets that are not auxiliary with basicPolicy Gang (whose gang minimum
        is every such pod)."""
        if self.basic_policy == BasicPolicy.GANG:
            return self.counted_workers
        return self.min_workers_num

    def retry_codes(self, worker_set: str) -> tuple[int, ...]:
        """retry_codes: the leader's ("") or the named set's retryOnExitCodes."""
        if not worker_set:
            return self.leader_retry_on_exit_codes
        ws = self.worker_set(worker_set)
        return ws.retry_on_exit_codes if ws is not None else ()

    def stall_of(self, worker_set: str) -> StallPolicy:
        """stall_of: the leader's ("") or the named set's StallPolicy."""
        if not worker_set:
            return self.leader_stall
        ws = self.worker_set(worker_set)
        return ws.stall if ws is not None else StallPolicy()

    def template_of(self, worker_set: str) -> PodTemplate:
        """template_of: the leader's template for "", else the named worker set's."""
        if not worker_set:
            return self.leader
        return next(ws.template for ws in self.worker_sets if ws.name == worker_set)

    def pod_slots(self) -> list[PodSlot]:
        """pod_slots lists the leader, then every wanted worker by (set order, index), each
        with its rank (see rank_of)."""
        slots = [PodSlot(f"{self.name}-{self.leader_name}", Role.LEADER, "", 0, 0, self.leader)]
        first = 0
        for ws in self.worker_sets:
            for index in range(ws.counts):
                name = f"{self.name}-{ws.name}-{index}"
                slots.append(PodSlot(name, Role.WORKER, ws.name, index, first + index, ws.template))
            first += ws.most
        return slots

    def minimum_ranks(self, preferred: Collection[int] = ()) -> frozenset[int]:
        """minimum_ranks are the worker ranks of the gang minimum.

        Auxiliary sets contribute none. Each other set first contributes its `min_count` lowest indices; the rest of
        `min_workers_num` is taken from the `preferred` ranks (the workers running, when a
        running job is scaled), then set by set in declared order. The leader is always in
        the minimum.
        """
        chosen: set[int] = set()
        ranks: list[int] = []
        first = 0
        for ws in self.worker_sets:
            if not ws.auxiliary:  # a helper role is never in the minimum
                chosen.update(range(first, first + ws.min_count))
                ranks.extend(range(first, first + ws.counts))
            first += ws.most
        remaining = self.min_workers_num - len(chosen)
        wanted = set(preferred)
        for rank in sorted(ranks, key=lambda r: r not in wanted):  # stable: preferred first
            if remaining <= 0:
                break
            if rank not in chosen:
                chosen.add(rank)
                remaining -= 1
        return frozenset(chosen)
