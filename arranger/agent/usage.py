"""usage: what each pod attempt on this node uses, sampled every few seconds.

A pod's processes are its shim's and their descendants (a container's: its conmon's, which
parents the container's processes), found in one pass over the machine's processes (their
parent pids); nothing is spawned and no process is signalled. For each pod:
- CPU in cores: the change of its live processes' CPU time (user + system) since the last
  sample, over the time between (a process that ended takes its time with it: the change is
  then counted from what is left, never below 0);
- memory: the resident set of its processes now, and the most seen in any sample (peak);
- GPUs, where NVML answers: the memory its processes hold on each GPU and their utilisation
  (per process where the driver keeps it, else the whole GPU's, marked `shared=True` when
  other pods hold the same GPU).

One sample costs a read of /proc/<pid>/stat for every process and of /proc/<pid>/statm for a
pod's (see bench/RESULTS.md for 50 pods).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import psutil
import structlog

log = structlog.get_logger("arranger.agent")

Attempt = tuple[str, int]  # (pod uid, attempt)


@dataclass(frozen=True)
class GpuUse:
    index: int
    memory_bytes: int  # held by the pod's processes
    utilization: float  # percent, -1 when NVML does not say
    whole_gpu: bool = False  # utilization is the whole GPU's, not the pod's own


@dataclass(frozen=True)
class PodUse:
    uid: str
    attempt: int
    cpu_cores: float
    memory_bytes: int
    memory_peak_bytes: int
    gpus: tuple[GpuUse, ...] = ()


@dataclass
class _Seen:
    cpu_s: float
    at: float
    peak: int


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    memory_bytes: int
    utilization: float  # percent, -1 when unknown


@dataclass
class GpuReading:
    """GpuReading: what NVML says of one GPU now."""

    index: int
    utilization: float  # the whole GPU's, percent; -1 unknown
    processes: list[GpuProcess] = field(default_factory=list)


GpuProbe = Callable[[], list[GpuReading]]


class UsageSampler:
    """UsageSampler: `sample` measures the given attempts, each from its root process."""

    def __init__(self, gpus: GpuProbe | None = None, clock: Callable[[], float] = time.monotonic):
        self._gpus = gpus
        self._clock = clock
        self._seen: dict[Attempt, _Seen] = {}

    def sample(self, roots: Mapping[Attempt, int]) -> list[PodUse]:
        """sample: one PodUse per attempt whose root process lives; an attempt's first sample
        says 0 cores (there is nothing yet to measure a change against)."""
        now = self._clock()
        children: dict[int, list[int]] = {}
        cpu: dict[int, float] = {}
        for proc in psutil.process_iter(["ppid", "cpu_times"]):
            info = proc.info
            times = info.get("cpu_times")
            if times is None:
                continue
            children.setdefault(info["ppid"], []).append(proc.pid)
            cpu[proc.pid] = times.user + times.system
        owner: dict[int, Attempt] = {}
        trees: dict[Attempt, list[int]] = {}
        for attempt, root in roots.items():
            if root in cpu:
                trees[attempt] = _tree(root, children)
                owner.update(dict.fromkeys(trees[attempt], attempt))
        gpu_uses = self._gpu_uses(owner)
        uses = []
        for attempt, pids in trees.items():
            cpu_s = sum(cpu.get(pid, 0.0) for pid in pids)
            rss = sum(_rss(pid) for pid in pids)
            seen = self._seen.get(attempt)
            cores = 0.0
            if seen is not None and now > seen.at:
                cores = max(0.0, cpu_s - seen.cpu_s) / (now - seen.at)
            peak = max(rss, seen.peak if seen else 0)
            self._seen[attempt] = _Seen(cpu_s, now, peak)
            uses.append(
                PodUse(
                    attempt[0],
                    attempt[1],
                    round(cores, 3),
                    rss,
                    peak,
                    tuple(gpu_uses.get(attempt, ())),
                )
            )
        for gone in set(self._seen) - set(roots):
            del self._seen[gone]
        return uses

    def _gpu_uses(self, owner: Mapping[int, Attempt]) -> dict[Attempt, list[GpuUse]]:
        if self._gpus is None:
            return {}
        try:
            readings = self._gpus()
        except Exception as exc:  # NVML raises its own errors; usage must never stop the agent
            log.debug("NVML usage not read", reason=str(exc))
            return {}
        found: dict[Attempt, list[GpuUse]] = {}
        for gpu in readings:
            per_pod: dict[Attempt, list[GpuProcess]] = {}
            for process in gpu.processes:
                attempt = owner.get(process.pid)
                if attempt is not None:
                    per_pod.setdefault(attempt, []).append(process)
            for attempt, processes in per_pod.items():
                own = [p.utilization for p in processes if p.utilization >= 0]
                utilization = min(100.0, sum(own)) if own else gpu.utilization
                found.setdefault(attempt, []).append(
                    GpuUse(
                        gpu.index,
                        sum(p.memory_bytes for p in processes),
                        utilization,
                        whole_gpu=not own and len(per_pod) > 1,
                    )
                )
        return found


def _tree(root: int, children: Mapping[int, Iterable[int]]) -> list[int]:
    """_tree: the root and every descendant, each once."""
    found, todo = [], [root]
    seen = {root}
    while todo:
        pid = todo.pop()
        found.append(pid)
        for child in children.get(pid, ()):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return found


def _rss(pid: int) -> int:
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return 0


def nvml_probe() -> GpuProbe | None:
    """nvml_probe: a reader of every NVIDIA GPU's utilisation and processes, or None where
    NVML cannot be loaded (no driver: nothing to read). NVML stays initialised for the
    agent's life, as nvidia-smi's daemon mode keeps it."""
    try:
        import pynvml  # noqa: PLC0415 (optional at run time: no driver, no library)

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception:
        return None
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    last_seen = [0] * count  # per GPU: the newest per-process sample already read (µs)

    def read() -> list[GpuReading]:
        readings = []
        for index, handle in enumerate(handles):
            reading = GpuReading(index, float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            own: dict[int, float] = {}
            try:
                for s in pynvml.nvmlDeviceGetProcessUtilization(handle, last_seen[index]):
                    own[s.pid] = float(s.smUtil)
                    last_seen[index] = max(last_seen[index], int(s.timeStamp))
            except pynvml.NVMLError:  # not kept by this GPU or driver, or no new sample
                pass
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                memory = int(p.usedGpuMemory or 0)
                reading.processes.append(GpuProcess(p.pid, memory, own.get(p.pid, -1.0)))
            readings.append(reading)
        return readings

    return read
