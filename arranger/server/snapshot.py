"""snapshot keeps the scheduling core's input up to date as the controller's records change.

`SchedulingState` holds each job's part of the snapshot (its JobInfo and what its pods hold on
which node) and each node's NodeInfo. Every committed change names the jobs, pods and nodes it
touched (its Effects); only those are looked at again, so building a snapshot costs what changed
since the last one, not every node and every job ever submitted. `build_snapshot` is the same
computation from scratch, the reference the incremental state is tested against.

It also keeps what the core would otherwise build from every node and job each cycle: the
node arrays (NodeArrays, changed rows updated) and the job index (JobIndex: the jobs with pods
to place, what each queue's jobs hold, the pods being stopped), handed to the core in the
snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from arranger.sched import (
    GpuInfo,
    JobInfo,
    NodeInfo,
    PodRequest,
    QueueInfo,
    Res,
    Snapshot,
)
from arranger.sched.nodes import NodeArrays
from arranger.sched.snapshot import JobIndex, PodShape, RunningPod, pod_shapes
from arranger.server.controller import Controller
from arranger.server.effects import Effects
from arranger.server.model import JobRecord, NodeRecord
from arranger.states import NodeState, PodState

K = TypeVar("K")


@dataclass
class JobPart:
    """JobPart: a job's part of the snapshot. `info` is None when it neither holds nor waits
    for anything; `cpu`, `memory` and `gpus` are what its pods hold per node (per node and GPU);
    `outside` is what an ended job's processes hold for its queue (cleanPodPolicy None);
    `live` says the tick must still look at it (unfinished, or holding resources); `shapes`
    counts its pods in the snapshot by shape."""

    queue: str
    info: JobInfo | None = None
    cpu: dict[str, int] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)
    gpus: dict[tuple[str, int], int] = field(default_factory=dict)
    outside: Res = Res()
    live: bool = False
    shapes: dict[PodShape, int] = field(default_factory=dict)  # its pods in the snapshot

    def nodes(self) -> set[str]:
        return set(self.cpu) | set(self.memory) | {node for node, _ in self.gpus}


def part_of(job: JobRecord) -> JobPart:
    """part_of: the job's part of the snapshot, as its records are now. Pods being stopped are
    marked terminating (the core counts on their room coming free), except those stopped to run
    again on the same node. An ended job is there only with the pods it is stopping; processes
    left running by cleanPodPolicy None count for its queue."""
    spec = job.spec
    active = not (job.deleted or job.terminating or job.stage.finished or job.waiting)
    part = JobPart(spec.queue)
    pending: list[PodRequest] = []
    running: list[RunningPod] = []
    held = Res()
    for pod in job.pods.values():
        template = spec.template_of(pod.worker_set)
        res = template.resources
        if pod.state.holds_resources:
            part.live = True
            part.cpu[pod.node] = part.cpu.get(pod.node, 0) + res.cpu_milli
            part.memory[pod.node] = part.memory.get(pod.node, 0) + res.memory_bytes
            for share in pod.gpus:
                key = (pod.node, share.index)
                part.gpus[key] = part.gpus.get(key, 0) + share.milli
            request = Res(res.cpu_milli, res.memory_bytes, res.gpu_milli)
            # A pod being stopped to run again on the same node keeps its room.
            leaving = pod.leaving
            if not active and not leaving:
                part.outside = part.outside + request
                continue
            held = held + request
            running.append(
                RunningPod(
                    name=pod.name,
                    node=pod.node,
                    request=request,
                    gpus=pod.gpus,
                    role=pod.role,
                    in_minimum=pod.in_minimum,
                    start_time=pod.start_time,
                    terminating=leaving,
                )
            )
        elif pod.state == PodState.PENDING and not pod.done and active:
            pending.append(
                PodRequest(
                    name=pod.name,
                    role=pod.role,
                    rank=pod.rank,
                    cpu_milli=res.cpu_milli,
                    memory_bytes=res.memory_bytes,
                    gpu_milli=res.gpu_milli,
                    gpu_type=res.gpu_type,
                    node_selector=template.node_selector,
                    in_minimum=pod.in_minimum,
                    worker_set=pod.worker_set,
                    preferred_gpu_type=res.preferred_gpu_type,
                    container=bool(template.image),
                    auxiliary=job.spec.is_auxiliary(pod.worker_set),
                )
            )
    part.live = part.live or (not job.deleted and not job.stage.finished)
    if pending or running:  # an ended job appears only with the pods it is stopping
        part.info = JobInfo(
            id=job.id,
            name=spec.name,
            queue=spec.queue,
            priority=spec.priority,
            submit_time=job.submit_time,
            pending=tuple(pending),
            running=tuple(running),
            basic_policy=spec.basic_policy,
            job_queue_policy=spec.job_queue_policy,
            infeasible_since=job.infeasible_since,
            allocated=held,
            schedule_timeout_s=spec.schedule_timeout_s,
            machine_group_only=spec.machine_group_only,
            waiting_since=job.waiting_since if job.waiting_since is not None else job.submit_time,
            preemptible=spec.preemptible,
            start_time=job.start_time,
            max_runtime_s=spec.max_runtime_s,
            checkpoint_time=job.checkpoint_time,
        )
        part.shapes = pod_shapes(part.info)
    return part


class SchedulingState:
    """SchedulingState: the snapshot's parts, kept as changes are committed.

    `changed(fx)` is told every change as it is made (before it is stored, in the same order
    as the records change); `snapshot(now)` refreshes what those changes touched and assembles
    the core's input. `labels`: node labels the core filters on (the machine-group label),
    kept as columns of the node arrays. What it keeps always equals what `build_snapshot` computes from the
    records."""

    def __init__(self, controller: Controller, labels: Iterable[str] = ()) -> None:
        self.controller = controller
        self.labels = tuple(labels)  # node labels the node arrays keep as columns
        self.parts: dict[str, JobPart] = {}  # only jobs that are live or appear in snapshots
        self.cpu: dict[str, int] = {}
        self.memory: dict[str, int] = {}
        self.gpus: dict[tuple[str, int], int] = {}
        self.outside: dict[str, Res] = {}
        self.infos: dict[str, NodeInfo] = {}
        # The JobIndex's parts. `jobs`, `pending` and `stopping` (jobs with a pod being
        # stopped) keep the order of `parts`: a refreshed job goes to the end of all four.
        self.jobs: dict[str, JobInfo] = {}  # the snapshot's jobs, in the order of `parts`
        self.pending: dict[str, JobInfo] = {}
        self.stopping: dict[str, JobInfo] = {}
        self.held: dict[str, Res] = {}  # per queue, what its jobs in the snapshot hold
        self.queue_jobs: dict[str, int] = {}  # per queue, its jobs in the snapshot
        self.shapes: dict[PodShape, int] = {}  # the snapshot's pods by shape
        self.arrays: NodeArrays | None = None  # built with the first snapshot, then updated
        self._position: dict[str, int] | None = None  # the nodes' names, sorted, and places
        self._sorted: list[NodeInfo] | None = None  # their infos, in that order (kept in place)
        self._dirty_jobs: set[str] = set(controller.jobs)
        self._dirty_nodes: set[str] = set(controller.nodes)

    def changed(self, fx: Effects) -> None:
        """changed: the jobs, pods and nodes `fx` touched may differ from what is kept."""
        self._dirty_jobs |= fx.touched_jobs()
        self._dirty_nodes |= fx.nodes

    def everything_changed(self) -> None:
        """everything_changed: look at every record again (after records were loaded)."""
        self._dirty_jobs |= set(self.controller.jobs) | set(self.parts)
        self._dirty_nodes |= set(self.controller.nodes) | set(self.infos)

    def live_jobs(self) -> list[JobRecord]:
        """live_jobs: the jobs the clock may still change (unfinished, or holding resources)."""
        self.refresh()
        jobs = self.controller.jobs
        return [jobs[i] for i, part in self.parts.items() if part.live and i in jobs]

    def snapshot(self, now: float, kept: bool = True) -> Snapshot:
        """snapshot: the core's input now; with the kept node arrays and job index unless not
        `kept` (the core then builds them itself)."""
        self.refresh()
        if self._position is None:
            self._position = {name: i for i, name in enumerate(sorted(self.infos))}
        if self._sorted is None:
            self._sorted = [self.infos[name] for name in self._position]
        nodes = tuple(self._sorted)
        controller = self.controller
        queues = tuple(q.info(self.outside.get(q.name, Res())) for q in controller.queues.values())
        jobs = tuple(self.jobs.values())
        arrays, index = None, None
        if kept:
            if self.arrays is None:
                self.arrays = NodeArrays(nodes)
                for label in self.labels:
                    self.arrays.keep_label(label)
            arrays, index = self.arrays.handed_out(), self._index(jobs, queues)
        return Snapshot(
            now=now,
            nodes=nodes,
            jobs=jobs,
            queues=queues,
            reservation=controller.reservation,
            arrays=arrays,
            index=index,
            claims=controller.claims,
        )

    def _index(self, jobs: tuple[JobInfo, ...], queues: tuple[QueueInfo, ...]) -> JobIndex:
        """_index: the snapshot's JobIndex, from what is kept (equal to index_jobs)."""
        listed = {q.name for q in queues}
        unlisted = [name for name in self.queue_jobs if name not in listed]
        if len(unlisted) > 1:  # rare: order them as they first appear among the jobs
            first: dict[str, None] = {}
            for job in jobs:
                if job.queue in self.queue_jobs and job.queue not in listed:
                    first[job.queue] = None
                    if len(first) == len(unlisted):
                        break
            unlisted = list(first)
        terminating = tuple(
            (job, pod) for job in self.stopping.values() for pod in job.running if pod.terminating
        )
        return JobIndex(
            tuple(self.pending.values()),
            dict(self.held),
            tuple(unlisted),
            terminating,
            dict(self.shapes),
        )

    def refresh(self) -> None:
        """refresh recomputes the parts of the jobs and the nodes changed since last time."""
        jobs = self.controller.jobs
        for job_id in self._dirty_jobs:
            old = self.parts.pop(job_id, None)
            self.jobs.pop(job_id, None)
            self.pending.pop(job_id, None)
            self.stopping.pop(job_id, None)
            if old is not None:
                self._add(old, -1)
            job = jobs.get(job_id)
            if job is None:
                continue
            new = part_of(job)
            if new.live:  # a job that is not live holds nothing and waits for nothing
                self.parts[job_id] = new
                self._add(new, 1)
                info = new.info
                if info is not None:
                    self.jobs[job_id] = info
                if info is not None and info.pending:
                    self.pending[job_id] = info
                if info is not None and any(p.terminating for p in info.running):
                    self.stopping[job_id] = info
        self._dirty_jobs.clear()
        nodes = self.controller.nodes
        changed: dict[str, NodeInfo | None] = {}
        for name in self._dirty_nodes:
            record = nodes.get(name)
            before = self.infos.pop(name, None)
            changed[name] = None
            if record is not None:
                self.infos[name] = changed[name] = self._info(record)
            now_info = changed[name]
            if before is None or now_info is None:
                self._position = self._sorted = None  # the set of nodes changed
            elif self._sorted is not None and self._position is not None:
                self._sorted[self._position[name]] = now_info
        self._dirty_nodes.clear()
        if self.arrays is not None and changed:
            self.arrays.update(changed)

    def _add(self, part: JobPart, sign: int) -> None:
        if part.info is not None:
            queue, held = part.queue, part.info.allocated.scaled(sign)
            _add_res(self.held, queue, held)
            _add_counts(self.queue_jobs, [(queue, 1)], sign)
            _add_counts(self.shapes, part.shapes.items(), sign)
        _add_counts(self.cpu, part.cpu.items(), sign)
        _add_counts(self.memory, part.memory.items(), sign)
        _add_counts(self.gpus, part.gpus.items(), sign)
        if part.outside != Res():
            _add_res(self.outside, part.queue, part.outside.scaled(sign))
        self._dirty_nodes |= part.nodes()

    def _info(self, node: NodeRecord) -> NodeInfo:
        return node_info(node, self.cpu, self.memory, self.gpus)


def _add_res(amounts: dict[K, Res], key: K, change: Res) -> None:
    """_add_res adds `change` to amounts[key], leaving out amounts of nothing."""
    total = amounts.get(key, Res()) + change
    if total == Res():
        amounts.pop(key, None)
    else:
        amounts[key] = total


def _add_counts(counts: dict[K, int], items: Iterable[tuple[K, int]], sign: int) -> None:
    for key, value in items:
        total = counts.get(key, 0) + sign * value
        if total:
            counts[key] = total
        else:
            counts.pop(key, None)


def node_info(
    node: NodeRecord, cpu: dict[str, int], memory: dict[str, int], gpus: dict[tuple[str, int], int]
) -> NodeInfo:
    """node_info: the node as the core sees it, with what the pods on it hold."""
    return NodeInfo(
        name=node.name,
        cpu_milli=node.cpu_milli,
        memory_bytes=node.memory_bytes,
        gpus=tuple(
            GpuInfo(g.index, g.model, gpus.get((node.name, g.index), 0), g.problem)
            for g in node.gpus
        ),
        used_cpu_milli=cpu.get(node.name, 0),
        used_memory_bytes=memory.get(node.name, 0),
        labels=node.labels,
        schedulable=node.schedulable,
        ready=node.state == NodeState.READY,
        containers=node.runs_images,
        shares=node.shares,
    )


def build_snapshot(controller: Controller, now: float) -> Snapshot:
    """build_snapshot: every node with what its pods hold (pods being stopped included), every
    queue with what its jobs hold, and every job that holds resources or waits for them,
    computed from every record (see SchedulingState for the incremental way)."""
    return SchedulingState(controller).snapshot(now, kept=False)
