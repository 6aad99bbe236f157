"""usage: the latest usage sample of each live pod attempt, and each job's running totals.

Samples are telemetry, not state: they are kept in memory only (a restarted server starts
them afresh) and never written but in a finished job's history record (its peaks and
averages, see `summary`). Only a sample of an attempt the server knows runs on the node that
sent it is kept; an attempt's entry goes when its job finishes or is removed, so the book holds
no more than the live attempts.

A job's totals integrate its pods' samples over the time between them (at most
MAX_GAP_S of it: a pod not heard from for longer counts only that long):
- cpu core-seconds and observed pod-seconds (their ratio: the average cores of a pod),
- the most cores and resident memory the job's pods held together at any sample,
- GPU utilisation weighted by time, and the most GPU memory held together.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

from arranger.server.history import HistoryRecord
from arranger.server.view import ClusterView
from arranger.v1 import agent_pb2, job_pb2

MAX_GAP_S = 60.0
MAX_PODS_PER_REPORT = 10_000
MAX_GPUS = 64
MAX_BYTES = 2**48  # one figure's most (256 TiB): a job's sums of them stay within int64
INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class GpuUse:
    index: int
    utilization: float  # percent; -1 unknown
    memory_bytes: int
    whole_gpu: bool = False


@dataclass(frozen=True)
class Sample:
    """Sample: one pod attempt's usage as an agent measured it, stamped when it arrived."""

    attempt: int
    cpu_cores: float
    memory_bytes: int
    memory_peak_bytes: int
    gpus: tuple[GpuUse, ...]
    time: float


@dataclass
class JobTotals:
    """JobTotals: a job's usage so far (see the module's docstring)."""

    cpu_core_s: float = 0.0
    pod_s: float = 0.0  # pod-seconds observed
    peak_cpu_cores: float = 0.0
    peak_memory_bytes: int = 0
    gpu_util_s: float = 0.0  # utilisation percent x seconds, over GPUs with a figure
    gpu_s: float = 0.0  # GPU-seconds observed with a utilisation figure
    peak_gpu_memory_bytes: int = 0

    @property
    def avg_cpu_cores(self) -> float:
        return self.cpu_core_s / self.pod_s if self.pod_s else 0.0

    @property
    def avg_gpu_utilization(self) -> float:
        """avg_gpu_utilization: percent, -1 when no GPU figure came."""
        return self.gpu_util_s / self.gpu_s if self.gpu_s else -1.0


@dataclass
class UsageBook:
    """UsageBook: pod uid -> its latest sample; job id -> its totals."""

    latest: dict[str, Sample] = field(default_factory=dict)
    totals: dict[str, JobTotals] = field(default_factory=dict)
    _pods_of: dict[str, set[str]] = field(default_factory=dict)
    # pod uid -> (attempt, since when its GPUs read idle, its last idle reading): kept by
    # idle_gpus, let go here
    idle_since: dict[str, tuple[int, float, float]] = field(default_factory=dict)

    def report(self, node: str, samples: Iterable[tuple[str, Sample]], view: ClusterView) -> int:
        """report keeps the samples of attempts that run on `node` now; how many it kept."""
        touched: set[str] = set()
        kept = 0
        for uid, sample in samples:
            found = view.pod(uid)
            if found is None:
                continue
            job, pod = found
            if pod.node != node or pod.attempt != sample.attempt or not pod.live:
                continue
            if job.stage.finished:  # forgotten already: kept now, it would stay for good
                continue
            before = self.latest.get(uid)
            self.latest[uid] = sample
            self._pods_of.setdefault(job.id, set()).add(uid)
            totals = self.totals.setdefault(job.id, JobTotals())
            if before is not None and before.attempt == sample.attempt:
                gap = min(MAX_GAP_S, max(0.0, sample.time - before.time))
                totals.cpu_core_s += sample.cpu_cores * gap
                totals.pod_s += gap
                for gpu in sample.gpus:
                    if gpu.utilization >= 0:
                        totals.gpu_util_s += gpu.utilization * gap
                        totals.gpu_s += gap
            touched.add(job.id)
            kept += 1
        for job_id in touched:
            now = self.job_now(job_id)
            totals = self.totals[job_id]
            totals.peak_cpu_cores = max(totals.peak_cpu_cores, now.cpu_cores)
            totals.peak_memory_bytes = max(totals.peak_memory_bytes, now.memory_bytes)
            gpu_memory = _int64(g.memory_bytes for g in now.gpus)
            totals.peak_gpu_memory_bytes = max(totals.peak_gpu_memory_bytes, gpu_memory)
        return kept

    def job_now(self, job_id: str) -> Sample:
        """job_now: the job's pods' latest samples added up (GPU utilisation: their mean, per
        GPU index, over the pods that hold it; memory peaks: the sum of each pod's)."""
        samples = [self.latest[uid] for uid in self._pods_of.get(job_id, ()) if uid in self.latest]
        by_gpu: dict[int, list[GpuUse]] = {}
        for sample in samples:
            for gpu in sample.gpus:
                by_gpu.setdefault(gpu.index, []).append(gpu)
        gpus = []
        for index, uses in sorted(by_gpu.items()):
            known = [u.utilization for u in uses if u.utilization >= 0]
            utilization = sum(known) / len(known) if known else -1.0
            gpus.append(GpuUse(index, utilization, _int64(u.memory_bytes for u in uses)))
        return Sample(
            0,
            sum(s.cpu_cores for s in samples),
            _int64(s.memory_bytes for s in samples),
            _int64(s.memory_peak_bytes for s in samples),
            tuple(gpus),
            max((s.time for s in samples), default=0.0),
        )

    def forget(self, job_ids: Iterable[str]) -> dict[str, JobTotals]:
        """forget lets go of the jobs' samples and returns their totals (for history)."""
        taken = {}
        for job_id in job_ids:
            for uid in self._pods_of.pop(job_id, ()):
                self.latest.pop(uid, None)
                self.idle_since.pop(uid, None)
            totals = self.totals.pop(job_id, None)
            if totals is not None:
                taken[job_id] = totals
        return taken

    def settle(self, pods: Iterable[str], jobs: Iterable[str], view: ClusterView) -> None:
        """settle, after a change to these pods and jobs is stored: a pod whose attempt no
        longer runs shows no usage; a job that finished or is gone is forgotten."""
        for uid in pods:
            sample = self.latest.get(uid)
            found = view.pod(uid)
            if sample is not None and (
                found is None or not found[1].live or found[1].attempt != sample.attempt
            ):
                del self.latest[uid]
                self.idle_since.pop(uid, None)
        ended = [j for j in jobs if (job := view.job(j)) is None or job.stage.finished]
        self.forget(ended)


def add_usage(msg: job_pb2.TYJob, book: UsageBook) -> None:
    """add_usage puts each live pod's latest sample into a job's message."""
    for status in [msg.status.leader, *msg.status.workers]:
        sample = book.latest.get(f"{msg.metadata.id}/{status.name}")
        if sample is not None and sample.attempt == status.attempt:
            usage_to_proto(sample, status.usage)


def usage_to_proto(sample: Sample, out: job_pb2.Usage) -> None:
    out.cpu_cores, out.memory_bytes = sample.cpu_cores, sample.memory_bytes
    out.memory_peak_bytes = sample.memory_peak_bytes
    for gpu in sample.gpus:
        out.gpus.add(
            index=gpu.index,
            utilization=gpu.utilization,
            memory_bytes=gpu.memory_bytes,
            whole_gpu=gpu.whole_gpu,
        )
    if sample.time:
        out.time.FromNanoseconds(int(sample.time * 1e9))


def samples_of(report: agent_pb2.UsageReport, now: float) -> list[tuple[str, Sample]]:
    """samples_of: an agent's report as (pod uid, sample), stamped `now`; values out of
    range (an agent's bug or a forged report) are clamped, never trusted."""
    found = []
    for pod in report.pods[:MAX_PODS_PER_REPORT]:
        u = pod.usage
        gpus = tuple(
            GpuUse(
                g.index, min(100.0, max(-1.0, g.utilization)), _bytes(g.memory_bytes), g.whole_gpu
            )
            for g in u.gpus[:MAX_GPUS]
        )
        cores = u.cpu_cores if 0 <= u.cpu_cores < 1e6 else 0.0
        found.append(
            (
                pod.pod_uid,
                Sample(
                    pod.attempt,
                    cores,
                    _bytes(u.memory_bytes),
                    _bytes(u.memory_peak_bytes),
                    gpus,
                    now,
                ),
            )
        )
    return found


def _bytes(figure: int) -> int:
    return min(MAX_BYTES, max(0, figure))


def _int64(figures: Iterable[int]) -> int:
    """_int64: the sum, at most what a message's int64 (and a store's BIGINT) holds."""
    return min(INT64_MAX, sum(figures))


def with_usage(record: HistoryRecord, totals: JobTotals | None) -> HistoryRecord:
    """with_usage: the record with what the job's samples say (unchanged without samples)."""
    if totals is None:
        return record
    return dataclasses.replace(
        record,
        avg_cpu_cores=round(totals.avg_cpu_cores, 3) if totals.pod_s else None,
        peak_cpu_cores=round(totals.peak_cpu_cores, 3),
        peak_memory_bytes=totals.peak_memory_bytes,
        avg_gpu_utilization=round(totals.avg_gpu_utilization, 1) if totals.gpu_s else None,
        peak_gpu_memory_bytes=totals.peak_gpu_memory_bytes or None,
    )
