"""metrics: what an agent exposes to Prometheus on its `httpListen` port (off unless set).

Counters follow each pod attempt's changes as the supervisor reports them (a launch counts
once its process or container runs; a failure once it ends Failed, by its reason); gauges are
read when Prometheus scrapes: the attempts this node holds by state, whether the agent is
connected to a server, and each running pod's latest usage sample (labels `job_id` and `pod`,
as cAdvisor labels containers by pod). The registry is the agent's own, so that agents sharing a process
(`arranger dev`) keep theirs apart.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, ProcessCollector, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from arranger.agent.runs import PodRun
from arranger.agent.usage import PodUse
from arranger.states import CANNOT_START, PodState

# The `reason` label of arranger_agent_pod_failures_total: the name a failed attempt's reason
# starts with (README, "Failed pods"), its program's non-zero exit or fatal signal, or Other.
FAILURE_NAMES = frozenset(
    {
        *CANNOT_START,
        "OOMKilled",
        "StartError",
        "StartTimeout",
        "PackageUnavailable",
        "NoSuchUser",
        "RootRefused",
        "NoContainerRuntime",
        "ContainerError",
        "ImagePullFailed",
    }
)
EXITED = "ExitCode"  # "exit code N": the program exited with N, not 0
SIGNALED = "Signal"  # "killed by SIGSEGV": a signal it did not handle ended it
EXIT_REASON = re.compile(r"exit code -?[0-9]+")
SIGNAL_REASON = re.compile(r"killed by [A-Z0-9]+")
COUNTED = (PodState.RUNNING, PodState.FAILED)
PRUNE_AT = 1_000  # attempts remembered before those the supervisor let go are forgotten


class AgentMetrics:
    """AgentMetrics: the agent's registry; `changed` is told of every attempt that changed."""

    def __init__(self, runs: Callable[[], Iterable[PodRun]], connected: Callable[[], bool]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)  # the agent's own CPU seconds and memory
        self._launches = Counter(
            "arranger_agent_pod_launches",
            "Pod attempts this agent started that ran (a process or container).",
            registry=self.registry,
        )
        self._failures = Counter(
            "arranger_agent_pod_failures",
            "Pod attempts that ended Failed on this node, by reason.",
            ["reason"],
            registry=self.registry,
        )
        # What each attempt has counted, while the supervisor holds it (then forgotten).
        self._counted: dict[tuple[str, int], set[PodState]] = {}
        self._runs = runs
        self._prune_at = PRUNE_AT
        self.usage: list[PodUse] = []  # the latest sample of each running attempt
        self.registry.register(_Held(runs, connected, lambda: self.usage))

    def changed(self, run: PodRun) -> None:
        """changed: an attempt moved; it counts once as launched and once as failed, however
        often it is reported."""
        if run.state not in COUNTED:
            return
        counted = self._counted.setdefault((run.uid, run.attempt), set())
        if run.state in counted:
            return
        counted.add(run.state)
        if run.state == PodState.RUNNING:
            self._launches.inc()
        else:
            self._failures.labels(reason=failure_label(run.reason)).inc()
        if len(self._counted) > self._prune_at:
            held = {(r.uid, r.attempt) for r in self._runs()}
            self._counted = {k: v for k, v in self._counted.items() if k in held}
            self._prune_at = max(PRUNE_AT, 2 * len(self._counted))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def failure_label(reason: str) -> str:
    """failure_label: the `reason` label of a failed attempt with this reason: its leading
    name (`CommandNotFound: ...` is CommandNotFound) when FAILURE_NAMES holds it, ExitCode or
    Signal for a program that ended so, else Other (so that the label's values stay few)."""
    name = reason.partition(":")[0].strip()
    if name in FAILURE_NAMES:
        return name
    if EXIT_REASON.fullmatch(reason):
        return EXITED
    if SIGNAL_REASON.fullmatch(reason):
        return SIGNALED
    return "Other"


class _Held(Collector):
    """_Held: the gauges read at each scrape."""

    def __init__(
        self,
        runs: Callable[[], Iterable[PodRun]],
        connected: Callable[[], bool],
        usage: Callable[[], Iterable[PodUse]],
    ) -> None:
        self._runs = runs
        self._connected = connected
        self._usage = usage

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        connected = GaugeMetricFamily(
            "arranger_agent_connected", "1 while the agent has a session with a server, else 0."
        )
        connected.add_metric([], 1.0 if self._connected() else 0.0)
        yield connected
        pods = GaugeMetricFamily(
            "arranger_agent_pods", "Pod attempts this node holds, by state.", labels=["state"]
        )
        counts = dict.fromkeys((s.value for s in PodState), 0)
        for run in self._runs():
            counts[run.state.value] += 1
        for state, count in counts.items():
            pods.add_metric([state], float(count))
        yield pods
        yield from _usage(self._usage())


def _usage(uses: Iterable[PodUse]) -> Iterator[Metric]:
    labels = ["job_id", "pod"]
    cpu = GaugeMetricFamily(
        "arranger_pod_cpu_cores",
        "CPU seconds per second a pod used, at its last sample.",
        labels=labels,
    )
    memory = GaugeMetricFamily(
        "arranger_pod_memory_bytes", "A pod's resident memory at its last sample.", labels=labels
    )
    peak = GaugeMetricFamily(
        "arranger_pod_memory_peak_bytes",
        "The most resident memory of any sample of a pod.",
        labels=labels,
    )
    gpu_labels = [*labels, "gpu"]
    utilization = GaugeMetricFamily(
        "arranger_pod_gpu_utilization_ratio",
        "A pod's utilisation of a GPU (the whole GPU's where the driver keeps none per process).",
        labels=gpu_labels,
    )
    gpu_memory = GaugeMetricFamily(
        "arranger_pod_gpu_memory_bytes", "GPU memory a pod's processes hold.", labels=gpu_labels
    )
    for use in uses:
        job_id, _, pod = use.uid.partition("/")
        cpu.add_metric([job_id, pod], use.cpu_cores)
        memory.add_metric([job_id, pod], float(use.memory_bytes))
        peak.add_metric([job_id, pod], float(use.memory_peak_bytes))
        for gpu in use.gpus:
            if gpu.utilization >= 0:
                utilization.add_metric([job_id, pod, str(gpu.index)], gpu.utilization / 100)
            gpu_memory.add_metric([job_id, pod, str(gpu.index)], float(gpu.memory_bytes))
    yield from (cpu, memory, peak, utilization, gpu_memory)
