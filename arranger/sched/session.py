"""session holds one cycle: the snapshot, node arrays, queue state, and the callbacks the
enabled plugins registered. Actions work through it; plugins answer through it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

import numpy as np

from arranger.sched import reasons
from arranger.sched.cluster import Snapshot
from arranger.sched.config import SchedulerConfig
from arranger.sched.framework import (
    PLUGINS,
    Admission,
    AllocateHook,
    ClaimCheck,
    Evictable,
    GpuChooser,
    JobKey,
    Minimum,
    NodeFilter,
    Plugin,
    Preemptable,
    QueueKey,
    Scorer,
)
from arranger.sched.nodes import BoolArray, FloatArray, Index, NodeArrays
from arranger.sched.plan import GpuShare, Plan, Refusal
from arranger.sched.resources import Res
from arranger.sched.snapshot import (
    DEFAULT_QUEUE,
    JobInfo,
    PodRequest,
    QueueInfo,
    RunningPod,
    index_jobs,
)
from arranger.sched.statement import Statement
from arranger.states import BasicPolicy


@dataclass
class QueueState:
    """QueueState is a queue during the cycle: `deserved` is set by the proportion plugin,
    `allocated` grows with every placement."""

    info: QueueInfo
    allocated: Res
    request: Res = Res()
    deserved: Res = Res()


@dataclass
class JobProgress:
    """JobProgress is what the cycle learned about a job: whether its minimum is placed and,
    if not, why; how many pods above the minimum are left and why."""

    minimum_placed: bool = False
    admitted: bool = False
    why: str = ""
    never: bool = False  # the minimum cannot fit even the empty cluster, for sure
    extras_left: int = 0
    extras_why: str = ""
    evicting: bool = False  # pods are being evicted to make room for it
    code: str = ""  # the decision's reason code, when an action sets one
    refused: list[Refusal] = field(default_factory=list)  # preempt or reclaim evicted nothing
    placed: list[str] = field(default_factory=list)


class Session:
    """Session is one scheduling cycle over one snapshot.

    The actions go through `pending_jobs`, the jobs with pods to place; jobs that only hold
    resources count in their queue's `allocated` and are looked at one by one only as
    victims (`snapshot.jobs`), when preempt or reclaim search for some.

    `registry` maps the plugin names of the config's tiers to their classes: the production
    registry, unless a subclass brings its own."""

    registry: Mapping[str, type[Plugin]] = PLUGINS

    def __init__(self, snapshot: Snapshot, config: SchedulerConfig) -> None:
        self.snapshot = snapshot
        self.config = config
        self.now = snapshot.now
        arrays = snapshot.arrays
        self.nodes = arrays.for_cycle() if arrays is not None else NodeArrays(snapshot.nodes)
        self.total = self.nodes.total()
        self.plan = Plan()
        index = snapshot.index
        if index is None:
            index = index_jobs(snapshot.jobs, snapshot.queues, shapes=False)
        self.index = index
        # The jobs with pods to place: the only ones the actions go through. Jobs that only
        # hold resources are looked at as victims (snapshot.jobs), when preemption needs them.
        self.pending_jobs = list(index.pending)
        self.queues: dict[str, QueueState] = {
            q.name: QueueState(q, q.held_outside) for q in snapshot.queues
        }
        for name in index.unlisted:
            self.queues[name] = QueueState(QueueInfo(name), Res())
        for name, held in index.held.items():
            queue = self.queues[name]
            queue.allocated = queue.allocated + held
        self.progress: dict[str, JobProgress] = {job.id: JobProgress() for job in self.pending_jobs}
        # Callbacks, in the order the plugins registered them.
        self.job_keys: list[JobKey] = []
        self.queue_keys: list[QueueKey] = []
        self.filters: list[NodeFilter] = []
        self.scorers: dict[BasicPolicy, Scorer] = {}
        self.score_terms: list[Scorer] = []
        self.admissions: list[Admission] = []
        self.on_allocate: list[AllocateHook] = []
        self.preemptable: list[Preemptable] = []
        self.reclaimable: list[Preemptable] = []
        self.evictable: list[Evictable] = []
        self.claim_checks: list[ClaimCheck] = []
        self.evicted: set[tuple[str, str]] = set()  # (job id, pod) chosen this cycle
        # Every running pod and job in the order victims are taken, sorted once per cycle.
        self.victim_order: tuple[list[tuple[JobInfo, RunningPod]], list[JobInfo]] | None = None
        # Jobs with pods not stopping, by what the preemptable rules look at (queue, priority,
        # opt-out), counted once per cycle for explaining refusals.
        self.victim_classes: dict[tuple[str, int, bool], tuple[JobInfo, set[str]]] | None = None
        # Jobs holding pods by the same, the first two of each (whether anyone may be evicted).
        self.running_classes: dict[tuple[str, int, bool], list[JobInfo]] | None = None
        self._mixed_models: bool | None = None
        # In victim_order's two lists, the victims before these are all stopping already.
        self.victim_cursors = [0, 0]
        # Per job, running workers beyond its minimum not yet evicted (counted when first asked).
        self.spare_workers: dict[str, int] = {}
        # The earliest time a victim passed over for its queue's minRunSeconds may be taken.
        self.protected_until: float | None = None
        self.terminating = list(index.terminating)
        # Room claimed by waiting preemptors: held until the cycle ends (see release_claims).
        self.holds: list[Statement] = []
        self.claimed: set[str] = set()
        # Jobs for which earlier cycles' evictions are freeing room: they go first for it.
        self.claimants = frozenset(claim.job_id for claim in snapshot.claims)
        self.minimum_of: Minimum = lambda job: []
        # Which GPUs of a node a pod gets, by basicPolicy (the node arrays' choice otherwise).
        self.gpu_choosers: dict[BasicPolicy, GpuChooser] = {}
        self._static: dict[Hashable, BoolArray] = {}
        self._empty: NodeArrays | None = None
        for name in config.plugins:
            self.registry[name](self).open()

    # Answers the actions ask for.

    def queue_of(self, job: JobInfo) -> QueueState:
        return self.queues.get(job.queue) or self.queues[DEFAULT_QUEUE]

    def job_key(self, job: JobInfo) -> tuple[float | str, ...]:
        """job_key orders jobs within a queue: the plugins' keys tier by tier, then submit
        time and id, so the order is total."""
        return (*(key(job) for key in self.job_keys), job.submit_time, job.id)

    def queue_key(self, queue: QueueState) -> tuple[float | str, ...]:
        return (*(key(queue) for key in self.queue_keys), queue.info.name)

    def minimum(self, job: JobInfo) -> list[PodRequest]:
        """minimum: the job's pending pods that must be placed together (the gang plugin's
        answer; without it, none: every pod is placed on its own)."""
        return self.minimum_of(job)

    def extras(self, job: JobInfo) -> list[PodRequest]:
        minimum = {p.name for p in self.minimum(job)}
        return [p for p in job.pending if p.name not in minimum]

    def preempt_refusal(self, job: JobInfo, victim: JobInfo, reclaim: bool) -> str | None:
        """preempt_refusal: None if every plugin lets `job` evict pods of `victim` (for
        reclaim, the reclaim rules instead of the preempt rules), else the first refusal."""
        rules = self.reclaimable if reclaim else self.preemptable
        if not rules:
            return reasons.PREEMPTION_NOT_TRIED
        for rule in rules:
            why = rule(job, victim)
            if why:
                return why
        return None

    def evict_refusal(self, job: JobInfo, victim: JobInfo, request: Res) -> str | None:
        """evict_refusal: None if `job` may take `request` more from `victim` now, else why."""
        for rule in self.evictable:
            why = rule(job, victim, request)
            if why:
                return why
        return None

    def claim_refusal(self, job: JobInfo, before: Res | None = None) -> str | None:
        """claim_refusal: None if the job, its minimum just placed, may keep room that is
        being freed for other jobs, else why not. `before`: what its queue held before the
        job evicted its own victims (then only what the queue gained over it counts)."""
        for check in self.claim_checks:
            why = check(job, before)
            if why:
                return why
        return None

    def admit(self, job: JobInfo, request: Res) -> str | None:
        """admit: None if the job may take `request` more, else why not."""
        for check in self.admissions:
            why = check(job, request)
            if why:
                return why
        return None

    def static_mask(
        self, pod: PodRequest, job: JobInfo, nodes: NodeArrays | None = None
    ) -> BoolArray:
        """static_mask: the nodes every filter lets this pod use, whatever their usage. For
        other arrays than the session's (the empty cluster) only the filters about what a node
        is apply, and the arrays' own `schedulable` (there: every ready node)."""
        whole = nodes is None or nodes is self.nodes
        filters = [f for f in self.filters if whole or not f.transient]
        key = (whole, *(f.key(pod, job) for f in filters))
        mask = self._static.get(key)
        if mask is None:
            mask = np.ones(len(self.nodes), dtype=np.bool_)
            for node_filter in filters:
                mask &= node_filter.mask(pod, job)
            if not whole:
                assert nodes is not None
                mask &= nodes.schedulable
            self._static[key] = mask
        return mask

    def filter_checks(
        self, pod: PodRequest, job: JobInfo, nodes: NodeArrays
    ) -> list[tuple[str, BoolArray]]:
        """filter_checks: (reason, nodes passing) for each filter that applies to `nodes`, in
        order, for counting why nodes are rejected."""
        if nodes is self.nodes:
            return [(f.reason, f.mask(pod, job)) for f in self.filters]
        checks = [(reasons.NODE_UNSCHEDULABLE, nodes.schedulable)]
        return checks + [(f.reason, f.mask(pod, job)) for f in self.filters if not f.transient]

    def score(self, pod: PodRequest, job: JobInfo, at: Index) -> FloatArray:
        """score ranks the nodes at `at` for the pod by its job's basicPolicy, plus the
        additive terms; higher is better."""
        scorer = self.scorers.get(job.basic_policy) or self.scorers.get(BasicPolicy.BINPACK)
        base: FloatArray = (
            scorer(pod, job, at)
            if scorer
            else np.zeros(len(self.nodes.names), dtype=np.float64)[at]
        )
        for term in self.score_terms:
            base = base + term(pod, job, at)
        return base

    def choose_gpus(
        self, nodes: NodeArrays, node: int, pod: PodRequest, job: JobInfo
    ) -> tuple[GpuShare, ...] | None:
        """choose_gpus: the node's GPUs for the pod, by its job's basicPolicy (None: the node
        cannot give them)."""
        chooser = self.gpu_choosers.get(job.basic_policy)
        return chooser(nodes, node, pod) if chooser else nodes.assign_gpus(node, pod)

    def hold(self, job: JobInfo, claim: Statement) -> None:
        """hold keeps a preemptor's tentative placement applied for the rest of the cycle, so
        that no other job is placed in the room being made for it."""
        self.holds.append(claim)
        self.claimed.add(job.id)

    def release_claims(self) -> None:
        for claim in reversed(self.holds):
            claim.discard()
        self.holds.clear()

    def mixed_models(self) -> bool:
        """mixed_models: some node has GPUs of more than one model (asked once per cycle)."""
        if self._mixed_models is None:
            self._mixed_models = any(len(models) > 1 for models in self.nodes.model_sets)
        return self._mixed_models

    def empty_nodes(self) -> NodeArrays:
        """empty_nodes: the same nodes with nothing used, built once per cycle."""
        if self._empty is None:
            self._empty = self.nodes.emptied()
        return self._empty
