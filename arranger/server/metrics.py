"""metrics: what the server exposes to Prometheus, named as Prometheus' conventions say.

Two kinds, in one registry of the server's own (never the process-wide default, so that two
servers in one process, as in tests, do not mix):
- counters and histograms fed as things happen: each scheduling cycle (its duration, the pods
  it placed and evicted) and each stored change (how long a job waited from submit until its
  gang was first placed, the jobs that ended by outcome). Counters start at 0 with the
  server, as Prometheus' do (its `increase()` and `rate()` take restarts in);
- gauges read from the controller's view when Prometheus scrapes: jobs by queue and stage, each
  queue's deserved share and allocation, each node's allocatable and allocated resources, and
  the GPUs that are idle, shared or full. The scrape runs on the event loop, between changes, so
  what it reads is consistent; it walks every job and every node once.

Resources follow kube-state-metrics: one family per measure, with `resource` (cpu, memory,
gpu) and `unit` (core, byte, gpu) labels.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    Info,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from arranger import __version__
from arranger.sched import Res
from arranger.sched.snapshot import SHARES_ENFORCED, SHARES_LOST, SHARES_PROMISED
from arranger.server.effects import Effects
from arranger.server.history import OUTCOMES
from arranger.server.view import ClusterView
from arranger.states import Stage

CALL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
CYCLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
PENDING_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3_600.0, 4 * 3_600.0, 86_400.0)
RESOURCES = (("cpu", "core"), ("memory", "byte"), ("gpu", "gpu"))
GPU_STATES = ("idle", "shared", "full")  # no pod holds it; pods hold part of it; all of it


@dataclass(frozen=True)
class ServerFacts:
    """ServerFacts: what the metrics read from the server besides its view, each when scraped."""

    view: Callable[[], ClusterView]
    deserved: Callable[[], Mapping[str, Res]]  # each queue's share at the last cycle
    active: Callable[[], bool]  # holds the lease and serves
    agents: Callable[[], int]  # agent streams open now
    store_writable: Callable[[], bool]  # the store took the last write
    store_failures: Callable[[], int]  # writes the store refused since the server started
    lease_remaining_s: Callable[[], float | None]  # None: a store that is not shared


class ServerMetrics:
    """ServerMetrics: the server's registry; `cycle` and `stored` are told what happens."""

    def __init__(self, facts: ServerFacts) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)  # CPU seconds, memory, open files
        self._cycle_seconds = Histogram(
            "arranger_scheduling_cycle_duration_seconds",
            "Time one scheduling cycle took to compute its plan.",
            buckets=CYCLE_BUCKETS,
            registry=self.registry,
        )
        self._cycles = Counter(
            "arranger_scheduling_cycles",
            "Scheduling cycles run, by cause: a change that could alter a decision, or the "
            "time the last plan said could (a starvation threshold, a timeout, a reservation).",
            ["cause"],
            registry=self.registry,
        )
        self._placed = Counter(
            "arranger_pods_placed", "Pods the scheduler placed on a node.", registry=self.registry
        )
        self._evicted = Counter(
            "arranger_pods_evicted",
            "Pods the scheduler evicted (preempt, reclaim) to make room for others.",
            registry=self.registry,
        )
        self._ended = Counter(
            "arranger_jobs_ended",
            "Jobs that ended since the server started, by outcome: Completed (the leader "
            "succeeded), Failed, Stopped, or Deleted before they finished. Each job once.",
            ["outcome"],
            registry=self.registry,
        )
        for outcome in OUTCOMES:
            self._ended.labels(outcome)  # each exposed from 0
        self._pending = Histogram(
            "arranger_job_pending_seconds",
            "Time from a job's submit until its gang was first placed.",
            buckets=PENDING_BUCKETS,
            registry=self.registry,
        )
        self._agents_refused = Counter(
            "arranger_agent_registrations_refused",
            "Agent registrations that made no node, by reason: node_name_held (the server "
            "refused: another agent holds the node name), not_accepted (the agent refused "
            "the server: it belongs to another cluster, or obeyed a newer server).",
            ["reason"],
            registry=self.registry,
        )
        self._calls = Counter(
            "arranger_grpc_requests",
            "gRPC calls answered, by method and status code (refusals included).",
            ["method", "code"],
            registry=self.registry,
        )
        self._call_seconds = Histogram(
            "arranger_grpc_request_duration_seconds",
            "Time a unary gRPC call took to answer, by method (streams are not timed).",
            ["method"],
            buckets=CALL_BUCKETS,
            registry=self.registry,
        )
        Info("arranger_build", "The release of this server.", registry=self.registry).info(
            {"version": __version__}
        )
        self.registry.register(_Cluster(facts))

    def cycle(self, seconds: float, placed: int, evicted: int, cause: str) -> None:
        """cycle: a scheduling cycle (run for `cause`: "change" or "time") computed its plan in
        `seconds`; `placed` of its pods were applied and `evicted` pods are stopped for
        others."""
        self._cycles.labels(cause).inc()
        self._cycle_seconds.observe(seconds)
        self._placed.inc(placed)
        self._evicted.inc(evicted)

    def call(self, method: str, code: str, seconds: float | None) -> None:
        """call: a gRPC call to `method` ended with `code`, after `seconds` (None: a stream)."""
        self._calls.labels(method, code).inc()
        if seconds is not None:
            self._call_seconds.labels(method).observe(seconds)

    def agent_refused(self, reason: str) -> None:
        """agent_refused: an agent's registration was turned away for `reason`."""
        self._agents_refused.labels(reason).inc()

    def stored(self, fx: Effects, view: ClusterView) -> None:
        """stored: the change `fx` is in the store. A job that went from Pending to Starting
        because its gang was placed has waited since its submit; a job that ended now (its
        first history record; one written again as its pods' ends come is not) is counted by
        its outcome."""
        outcomes = {r.job_id: r.outcome for r in fx.history if r.job_id in fx.ended}
        for outcome in outcomes.values():
            self._ended.labels(outcome).inc()
        for event in fx.events:
            if event.kind == Stage.STARTING.value and event.message.startswith("Scheduled"):
                job = view.job(event.job_id)
                if job is not None:
                    self._pending.observe(max(0.0, event.time - job.submit_time))

    def exposition(self) -> bytes:
        """exposition: every metric in Prometheus' text format."""
        return generate_latest(self.registry)


class _Cluster(Collector):
    """_Cluster: the gauges read from the view at each scrape."""

    def __init__(self, facts: ServerFacts) -> None:
        self._facts = facts

    def describe(self) -> list[Metric]:
        return []  # read at scrape time only: no fixed set of series to announce

    def collect(self) -> Iterator[Metric]:
        facts = self._facts
        active = GaugeMetricFamily(
            "arranger_server_active", "1 while this server holds the lease and serves, else 0."
        )
        active.add_metric([], 1.0 if facts.active() else 0.0)
        yield active
        agents = GaugeMetricFamily("arranger_agents_connected", "Agent streams open now.")
        agents.add_metric([], float(facts.agents()))
        yield agents
        writable = GaugeMetricFamily(
            "arranger_store_writable",
            "1 while the store takes writes (the last one was taken), else 0: changes are "
            "refused and health is NOT_SERVING until it takes one again.",
        )
        writable.add_metric([], 1.0 if facts.store_writable() else 0.0)
        yield writable
        failures = CounterMetricFamily(
            "arranger_store_write_failures", "Writes the store refused since the server started."
        )
        failures.add_metric([], float(facts.store_failures()))
        yield failures
        remaining = facts.lease_remaining_s()
        if remaining is not None:
            lease = GaugeMetricFamily(
                "arranger_lease_remaining_seconds",
                "How long this server may still act on its lease on a shared store without "
                "renewing it (renewed every third of the term; 0 on a standby).",
            )
            lease.add_metric([], remaining)
            yield lease
        view = facts.view()
        yield from _jobs_and_queues(view, facts.deserved())
        yield from _nodes(view)


def _jobs_and_queues(view: ClusterView, deserved: Mapping[str, Res]) -> Iterator[Metric]:
    jobs = GaugeMetricFamily(
        "arranger_jobs", "Jobs kept by the server, by queue and stage.", labels=["queue", "stage"]
    )
    loads = view.queue_loads()
    counts = {(q, stage): n for q, load in loads.items() for stage, n in load.stages.items()}
    held = {q: load.held for q, load in loads.items()}
    for (queue, stage), count in sorted(counts.items()):
        jobs.add_metric([queue, stage], float(count))
    yield jobs
    labels = ["queue", "resource", "unit"]
    allocated = GaugeMetricFamily(
        "arranger_queue_allocated", "Resources the pods of a queue's jobs hold.", labels=labels
    )
    share = GaugeMetricFamily(
        "arranger_queue_deserved",
        "A queue's fair share of the cluster at the last scheduling cycle.",
        labels=labels,
    )
    for queue in sorted(held):
        for family, amount in ((allocated, held[queue]), (share, deserved.get(queue, Res()))):
            for (resource, unit), value in zip(RESOURCES, _amounts(amount), strict=True):
                family.add_metric([queue, resource, unit], value)
    yield allocated
    yield share


def _amounts(res: Res) -> tuple[float, float, float]:
    return res.cpu_milli / 1000, float(res.memory_bytes), res.gpu_milli / 1000


def _nodes(view: ClusterView) -> Iterator[Metric]:
    labels = ["node", "resource", "unit"]
    allocatable = GaugeMetricFamily(
        "arranger_node_allocatable", "What a node offers to pods.", labels=labels
    )
    allocated = GaugeMetricFamily(
        "arranger_node_allocated", "What the pods placed on a node hold.", labels=labels
    )
    ready = GaugeMetricFamily(
        "arranger_node_schedulable",
        "1 if a node takes new pods (Ready, its agent connected, not cordoned), else 0.",
        labels=["node"],
    )
    gpus = GaugeMetricFamily(
        "arranger_gpus",
        "GPUs of Ready nodes by how much of each pods hold: none (idle), part (shared), all.",
        labels=["state"],
    )
    fragments = GaugeMetricFamily(
        "arranger_gpus_fragmented",
        "Free parts of shared GPUs, in GPUs: room only pods asking a fraction can use.",
    )
    agents = GaugeMetricFamily(
        "arranger_node_agent_info",
        "1 for each node, labelled with its agent's release as it last registered (releases "
        "side by side during an upgrade).",
        labels=["node", "version"],
    )
    offsets = GaugeMetricFamily(
        "arranger_node_clock_offset_seconds",
        "A node's clock minus the server's, as its agent's last message measured it.",
        labels=["node"],
    )
    unhealthy = GaugeMetricFamily(
        "arranger_gpu_unhealthy",
        "1 for each GPU its agent found unhealthy (an XID error, uncorrectable ECC): it takes "
        "no new pods.",
        labels=["node", "gpu"],
    )
    shares = GaugeMetricFamily(
        "arranger_node_gpu_shares_enforced",
        "1 if a node holds GPU shares to their limits now, 0 if not (-1: its enforcement is "
        "failing: it takes no new share).",
        labels=["node"],
    )
    by_state = dict.fromkeys(GPU_STATES, 0)
    free_parts = 0
    for node in view.nodes():
        on = view.held_on(node.name)
        used_gpus = {index: sum(by_job.values()) for index, by_job in on.gpus.items()}
        held = on.res
        offered = Res(node.cpu_milli, node.memory_bytes, 1000 * len(node.gpus))
        for family, amount in ((allocatable, offered), (allocated, held)):
            for (resource, unit), value in zip(RESOURCES, _amounts(amount), strict=True):
                family.add_metric([node.name, resource, unit], value)
        ready.add_metric([node.name], 1.0 if node.schedulable else 0.0)
        agents.add_metric([node.name, node.agent_version], 1.0)
        if node.clock_offset is not None:
            offsets.add_metric([node.name], node.clock_offset)
        if node.gpus:
            shares.add_metric([node.name], SHARES_GAUGE[node.shares])
        for gpu in node.gpus:
            if gpu.problem:
                unhealthy.add_metric([node.name, str(gpu.index)], 1.0)
        if node.state.value != "Ready":
            continue
        for gpu in node.gpus:
            used = used_gpus.get(gpu.index, 0)
            state = "idle" if used == 0 else "full" if used >= 1000 else "shared"
            by_state[state] += 1
            if state == "shared":
                free_parts += 1000 - used
    for state in GPU_STATES:
        gpus.add_metric([state], float(by_state[state]))
    fragments.add_metric([], free_parts / 1000)
    yield from (allocatable, allocated, ready, gpus, fragments, agents, offsets, unhealthy, shares)


SHARES_GAUGE = {SHARES_ENFORCED: 1.0, SHARES_PROMISED: 0.0, SHARES_LOST: -1.0}
