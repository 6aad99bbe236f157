"""effects are what the controller decides for the shell to carry out, after it has stored them.

The controller mutates its records and returns an Effects; the shell writes the dirty records
and events in one transaction, then sends the orders to agents. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from arranger.sched import GpuShare
from arranger.server.history import HistoryRecord
from arranger.server.model import EventRecord, ExperimentRecord, JobRecord
from arranger.server.reports import ReportChange
from arranger.spec import Package


@dataclass(frozen=True)
class LaunchOrder:
    """LaunchOrder starts one attempt of one pod on a node (see arranger.server.contract)."""

    node: str
    pod_uid: str
    attempt: int
    job_id: str
    job_name: str
    pod_name: str
    command: tuple[str, ...]
    args: tuple[str, ...]
    env: Mapping[str, str]
    working_dir: str
    gpus: tuple[GpuShare, ...]
    ports: Mapping[str, int]
    readiness_port: str
    volumes: tuple[tuple[str, str, str, bool], ...]
    cpu_milli: int
    memory_bytes: int
    image: str
    grace_s: float
    leader_port_name: str
    owner: str = ""  # the job's owner: with runAs: owner the pod runs as that account
    package: Package | None = None  # the job's working directory, to unpack for the pod
    pids: int = 0  # the pod's pids limit (0: the agent's default)


@dataclass(frozen=True)
class KillOrder:
    """KillOrder stops an attempt (SIGTERM, then SIGKILL after grace_s) and may remove its
    scratch directory; for an attempt that already ended it only removes the directory."""

    node: str
    pod_uid: str
    attempt: int
    grace_s: float
    reason: str
    remove_scratch: bool = False


@dataclass(frozen=True)
class Pruning:
    """Pruning: the events of these jobs go (their rows go as removed jobs), and so do events
    of no live job and history records that ended before the given times, and packages no
    job refers to (see `packages`)."""

    jobs: tuple[str, ...] = ()
    events_before: float | None = None
    history_before: float | None = None
    # Packages go when no job left in the store refers to them: those of the jobs pruned
    # now, and any last uploaded or asked for before `packages_before`.
    packages: tuple[str, ...] = ()
    packages_before: float | None = None


@dataclass
class Effects:
    """Effects of one stimulus: records to write, events to append, orders to send."""

    launches: list[LaunchOrder] = field(default_factory=list)
    kills: list[KillOrder] = field(default_factory=list)
    forgets: list[tuple[str, str]] = field(default_factory=list)
    purges: list[str] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)
    jobs: set[str] = field(default_factory=set)
    pods: set[str] = field(default_factory=set)
    nodes: set[str] = field(default_factory=set)
    disconnect: set[str] = field(default_factory=set)
    queues: set[str] = field(default_factory=set)
    removed_queues: set[str] = field(default_factory=set)
    removed: dict[str, JobRecord] = field(default_factory=dict)
    history: list[HistoryRecord] = field(default_factory=list)  # of jobs finished now
    ended: set[str] = field(default_factory=set)  # jobs that ended now: their first record
    rerecord: set[str] = field(default_factory=set)  # ended jobs whose record changed (a pod end)
    pruned: Pruning | None = None  # what retention removes from the store with this change
    schedule: bool = False
    experiments: list[ExperimentRecord] = field(default_factory=list)  # submitted now
    # Jobs' reported values as they changed: job id -> what its report changed.
    reports: dict[str, ReportChange] = field(default_factory=dict)

    def touched_jobs(self) -> set[str]:
        """touched_jobs: the jobs these effects changed, through their own records or pods."""
        return self.jobs | {uid.partition("/")[0] for uid in self.pods} | self.removed.keys()

    def event(
        self, now: float, kind: str, message: str, job: JobRecord | None = None, pod: str = ""
    ) -> None:
        """event appends a line to the history, of the job (and one of its pods) when given."""
        job_id, job_name = (job.id, job.name) if job is not None else ("", "")
        self.events.append(EventRecord(now, kind, message, job_id, job_name, pod))

    def merge(self, other: Effects) -> None:
        self.launches += other.launches
        self.kills += other.kills
        self.forgets += other.forgets
        self.purges += other.purges
        self.events += other.events
        self.jobs |= other.jobs
        self.pods |= other.pods
        self.nodes |= other.nodes
        self.disconnect |= other.disconnect
        self.queues |= other.queues
        self.removed_queues |= other.removed_queues
        self.removed.update(other.removed)
        self.history += other.history
        self.ended |= other.ended
        self.rerecord |= other.rerecord
        self.pruned = self.pruned or other.pruned
        self.schedule = self.schedule or other.schedule
        self.experiments += other.experiments
        self.reports.update(other.reports)

    def __bool__(self) -> bool:
        return bool(
            self.launches
            or self.kills
            or self.forgets
            or self.purges
            or self.events
            or self.jobs
            or self.pods
            or self.nodes
            or self.disconnect
            or self.queues
            or self.removed_queues
            or self.removed
            or self.history
            or self.pruned
            or self.schedule
            or self.experiments
            or self.reports
        )
