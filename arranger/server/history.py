"""history is the accounting of ended jobs: one record per job, written when it finishes or is
deleted before it finished, and written again as its pods' ends are reported (their exit codes).

A record outlives its job (`arranger delete`, retention's pruning) until the history retention
passes. Its `stage` is the job's (Succeeded, reason Stopped, for a stopped job; a job deleted
before it finished keeps the stage it had, reason Deleted); its `outcome` says how it ended:
Completed (the leader succeeded), Failed, Stopped or Deleted (see `outcome_of`). What it counts:

- usage: every pod attempt's request (cores, GiB of memory, GPUs) times the seconds it held
  its node, from the moment its launch was ordered until its end was reported, or until the
  job ended if that came first (a process left running by cleanPodPolicy None, or one still
  being stopped, is not counted past the job's end). A restarted pod counts each attempt; an
  attempt stopped by preemption, a drain or a moved leader counts until it ended; one lost
  with its node counts until it was declared Lost. Time a pod spent placed but not launched
  (back-off, waiting for the leader) is not counted: no process held the node.
- waited: submit to start; ran: start to end. `start` is when the job last went from Pending to
  Starting (after a preemption of the whole job, its latest start); a job that never started
  waited until it ended and ran 0 s.
- exit codes: the leader's and a count of the workers' by code, of each pod's last attempt,
  and each pod's own (`pod_exits`: name, code, the signal a code above 128 stands for, as
  shells and container runtimes write a process killed by signal N as 128 + N), of at most
  MAX_POD_EXITS pods: the leader, then the workers that did not exit 0, then the rest, each
  in its order (the counts by code cover every worker).
- a record is written when the job ends, and again, once per write, while its pods' ends
  come in (`records_to_write`): the last one stored holds every pod's exit.

Units: seconds here, hours in the record (`cpu_core_hours` = cores x hours, and so on).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from arranger.exits import signal_of
from arranger.server.model import JobRecord, PodRecord

GIB = 2**30
HOUR_S = 3600.0
COMPLETED, FAILED, STOPPED, DELETED = "Completed", "Failed", "Stopped", "Deleted"
OUTCOMES = (COMPLETED, FAILED, STOPPED, DELETED)
DELETED_REASON = "Deleted"
MAX_POD_EXITS = 100  # a record's size stays bounded whatever a job's size


def outcome_of(stage: str, reason: str, deleted: bool = False) -> str:
    """outcome_of: how a job ended, from its stage and reason ("" while it has not ended):
    Deleted when deleted before it finished, Stopped for reason Stopped, Completed when it
    Succeeded otherwise, Failed when it Failed."""
    if deleted:
        return DELETED
    if stage == "Succeeded":
        return STOPPED if reason == "Stopped" else COMPLETED
    return FAILED if stage == "Failed" else ""


@dataclass(frozen=True)
class PodExit:
    """PodExit: how a pod's last attempt ended: its exit code (None: none, as for a pod that
    never ran or was lost) and the signal that code stands for ("" if none)."""

    pod: str
    exit_code: int | None
    signal: str = ""


@dataclass(frozen=True)
class HistoryRecord:
    """HistoryRecord: an ended job's accounting, as stored. `worker_exits` is (exit code or
    None, number of workers), by code, None last; `pod_exits` every pod's, leader first."""

    job_id: str
    name: str
    owner: str
    queue: str
    priority: int
    submit_time: float
    start_time: float | None
    end_time: float
    stage: str
    reason: str
    message: str
    stopped_by: str
    leader_exit: int | None
    worker_exits: tuple[tuple[int | None, int], ...]
    nodes: tuple[str, ...]
    pods: int
    restarts: int
    cpu_core_hours: float
    gpu_hours: float
    memory_gib_hours: float
    # What its pods used, from the agents' samples (None: none came; see server.usage): the
    # average cores of a pod while sampled, the most cores and resident memory its pods held
    # together at a sample, GPU utilisation averaged over time (percent), the most GPU memory.
    avg_cpu_cores: float | None = None
    peak_cpu_cores: float | None = None
    peak_memory_bytes: int | None = None
    avg_gpu_utilization: float | None = None
    peak_gpu_memory_bytes: int | None = None
    outcome: str = ""  # Completed | Failed | Stopped | Deleted
    pod_exits: tuple[PodExit, ...] = ()
    experiment: str = ""  # the id of the experiment it was a member of

    @property
    def waited_s(self) -> float:
        started = self.start_time if self.start_time is not None else self.end_time
        return max(0.0, started - self.submit_time)

    @property
    def ran_s(self) -> float:
        return 0.0 if self.start_time is None else max(0.0, self.end_time - self.start_time)


def launched(job: JobRecord, pod: PodRecord, now: float) -> bool:
    """launched: the pod's attempt holds its node from `now`; the node is one the job ran on.
    True if that node is new to the job (the job's record changed)."""
    pod.held_since = now
    if pod.node and pod.node not in job.nodes_used:
        job.nodes_used.append(pod.node)
        return True
    return False


def charge(job: JobRecord, pod: PodRecord, now: float) -> bool:
    """charge adds to the job's usage the time the pod's attempt held its node, up to `now`,
    and ends that count; False if it held none (nothing was launched, or it was counted)."""
    if pod.held_since is None:
        return False
    _add(job, pod, max(0.0, now - pod.held_since))
    pod.held_since = None
    return True


def _add(job: JobRecord, pod: PodRecord, seconds: float) -> None:
    res = job.spec.template_of(pod.worker_set).resources
    job.cpu_core_s += res.cpu_milli / 1000 * seconds
    job.memory_gib_s += res.memory_bytes / GIB * seconds
    job.gpu_s += res.gpu_milli / 1000 * seconds


def deleted_unfinished(job: JobRecord, now: float) -> None:
    """deleted_unfinished: a job deleted before it finished ends now for its record: usage is
    counted up to now, as for a job that finishes (its pods are stopped)."""
    job.finish_time = now
    job.reason, job.message = DELETED_REASON, "deleted by request"
    for pod in job.pods.values():
        charge(job, pod, now)


def has_record(job: JobRecord) -> bool:
    """has_record: the job's history record was written (it finished, or was deleted before)."""
    return job.finish_time is not None and (job.stage.finished or job.deleted)


def record_of(job: JobRecord) -> HistoryRecord:
    """record_of: the ended job's record (its usage charged up to its end beforehand)."""
    assert has_record(job) and job.finish_time is not None, "only an ended job has one"
    exits = Counter(w.exit_code for w in job.workers())
    by_code = sorted(exits.items(), key=lambda item: (item[0] is None, item[0] or 0))
    return HistoryRecord(
        job_id=job.id,
        name=job.name,
        owner=job.owner,
        queue=job.spec.queue,
        priority=job.spec.priority,
        submit_time=job.submit_time,
        start_time=job.start_time,
        end_time=job.finish_time,
        stage=job.stage.value,
        reason=job.reason,
        message=job.message,
        stopped_by=job.stopped_by,
        leader_exit=job.leader.exit_code,
        worker_exits=tuple(by_code),
        nodes=tuple(job.nodes_used),
        pods=len(job.pods),
        restarts=job.leader_restarts + sum(job.set_restarts.values()),
        cpu_core_hours=job.cpu_core_s / HOUR_S,
        gpu_hours=job.gpu_s / HOUR_S,
        memory_gib_hours=job.memory_gib_s / HOUR_S,
        outcome=outcome_of(job.stage.value, job.reason, job.deleted and not job.stage.finished),
        pod_exits=_pod_exits(job),
        experiment=job.experiment,
    )


def _pod_exits(job: JobRecord) -> tuple[PodExit, ...]:
    """_pod_exits: the leader's exit, then the workers' that did not exit 0, then the rest:
    MAX_POD_EXITS at most."""
    workers = sorted(job.workers(), key=lambda w: w.exit_code == 0)  # stable: in order
    kept = (job.leader, *workers[: MAX_POD_EXITS - 1])
    return tuple(PodExit(p.name, p.exit_code, signal_of(p.exit_code)) for p in kept)


def records_to_write(
    made: Iterable[HistoryRecord], rerecord: Iterable[str], job: Callable[[str], JobRecord | None]
) -> list[HistoryRecord]:
    """records_to_write: the records one write stores: the last made for each job, and the
    record as it is now of each ended job in `rerecord` (its pods' ends came in), built once
    however many pod ends the write holds."""
    records = {record.job_id: record for record in made}
    for job_id in rerecord:
        found = job(job_id)
        if found is not None and has_record(found):
            records[job_id] = record_of(found)
    return list(records.values())


def record_before_history(job: JobRecord) -> HistoryRecord:
    """record_before_history: the record of a job that finished before records were kept (a
    store from an older version). Only each pod's last attempt is known, from its start to
    its end (or the job's), and the nodes of those attempts."""
    ended = job.finish_time
    assert ended is not None
    job = dataclasses.replace(job, nodes_used=[], cpu_core_s=0.0, memory_gib_s=0.0, gpu_s=0.0)
    for pod in job.pods.values():
        if pod.start_time is not None:
            end = pod.finish_time if pod.finish_time is not None else ended
            _add(job, pod, max(0.0, end - pod.start_time))
        if pod.node and pod.node not in job.nodes_used:
            job.nodes_used.append(pod.node)
    return record_of(job)
