"""Small builders for scheduling-core tests: node(...), pod(...), job(...)."""

from __future__ import annotations

import numpy as np

from arranger.sched import (
    NO_CAPABILITY,
    UNLIMITED,
    GpuInfo,
    JobInfo,
    NodeInfo,
    PodRequest,
    QueueInfo,
    Res,
    Snapshot,
)
from arranger.sched.nodes import NodeArrays
from arranger.sched.snapshot import RunningPod
from arranger.states import BasicPolicy, JobQueuePolicy, Role

GI = 2**30


def node(
    name: str,
    cpu: float = 8,
    memory_gi: float = 32,
    gpus: int = 0,
    model: str = "A100",
    used_cpu: float = 0,
    labels: dict[str, str] | None = None,
    schedulable: bool = True,
    gpu_used: list[int] | None = None,
) -> NodeInfo:
    used = gpu_used or [0] * gpus
    return NodeInfo(
        name=name,
        cpu_milli=round(cpu * 1000),
        memory_bytes=round(memory_gi * GI),
        gpus=tuple(GpuInfo(i, model, used[i]) for i in range(gpus)),
        used_cpu_milli=round(used_cpu * 1000),
        labels=labels or {},
        schedulable=schedulable,
    )


def pod(
    name: str,
    cpu: float = 1,
    memory_gi: float = 1,
    gpu: float = 0,
    gpu_type: str = "",
    leader: bool = False,
    rank: int = 0,
    in_minimum: bool = True,
    selector: dict[str, str] | None = None,
    preferred: str = "",
) -> PodRequest:
    return PodRequest(
        name=name,
        role=Role.LEADER if leader else Role.WORKER,
        rank=-1 if leader else rank,
        cpu_milli=round(cpu * 1000),
        memory_bytes=round(memory_gi * GI),
        gpu_milli=round(gpu * 1000),
        gpu_type=gpu_type,
        node_selector=selector or {},
        in_minimum=in_minimum,
        preferred_gpu_type=preferred,
    )


def gang(
    job_id: str,
    workers: int,
    cpu: float = 1,
    minimum: int | None = None,
    priority: int = 5,
    submit_time: float = 0.0,
    gpu: float = 0,
    leader_cpu: float | None = None,
    infeasible_since: float | None = None,
    policy: BasicPolicy = BasicPolicy.BINPACK,
    queue: str = "default",
    drf: bool = False,
    allocated: Res = Res(),
    bound: dict[str, str] | None = None,
    schedule_timeout_s: float | None = None,
    group_only: bool = False,
    memory_gi: float = 1,
) -> JobInfo:
    """gang: a job with a leader and `workers` workers, the first `minimum` in its gang minimum."""
    minimum = workers if minimum is None else minimum
    leader = pod(
        f"{job_id}-l",
        leader_cpu if leader_cpu is not None else cpu,
        memory_gi,
        gpu=gpu,
        leader=True,
    )
    pods = [leader] + [
        pod(f"{job_id}-w{i}", cpu, memory_gi, gpu=gpu, rank=i, in_minimum=i < minimum)
        for i in range(workers)
    ]
    return JobInfo(
        id=job_id,
        name=job_id,
        queue=queue,
        priority=priority,
        submit_time=submit_time,
        pending=tuple(pods),
        infeasible_since=infeasible_since,
        basic_policy=policy,
        job_queue_policy=JobQueuePolicy.DRF if drf else JobQueuePolicy.PRIORITY,
        allocated=allocated,
        schedule_timeout_s=schedule_timeout_s,
        running=tuple(
            RunningPod(name, node, Res(1000, GI, 0)) for name, node in (bound or {}).items()
        ),
        machine_group_only=group_only,
    )


def queue(
    name: str,
    weight: float = 1,
    cpu: float | None = None,
    gpu: float | None = None,
    allocated: Res = Res(),
    groups: tuple[str, ...] = (),
) -> QueueInfo:
    cap = NO_CAPABILITY
    if cpu is not None or gpu is not None:
        cap = Res(
            UNLIMITED if cpu is None else round(cpu * 1000),
            UNLIMITED,
            UNLIMITED if gpu is None else round(gpu * 1000),
        )
    return QueueInfo(name, weight, cap, allocated, frozenset(groups))


def snapshot(
    nodes: list[NodeInfo],
    jobs: list[JobInfo],
    now: float = 100.0,
    queues: list[QueueInfo] | None = None,
) -> Snapshot:
    return Snapshot(now=now, nodes=tuple(nodes), jobs=tuple(jobs), queues=tuple(queues or ()))


def job_of(job_id: str, *pods: PodRequest, priority: int = 5, submit_time: float = 0.0) -> JobInfo:
    """job_of: a job with exactly these pending pods."""
    return JobInfo(
        id=job_id,
        name=job_id,
        queue="default",
        priority=priority,
        submit_time=submit_time,
        pending=pods,
    )


def same_arrays(a: NodeArrays, b: NodeArrays) -> bool:
    """same_arrays: every column and list of the two node arrays is equal (values and dtypes)."""
    columns = all(
        getattr(a, name).dtype == getattr(b, name).dtype
        and np.array_equal(getattr(a, name), getattr(b, name))
        for name in NodeArrays.COLUMNS
    )
    lists = all(getattr(a, name) == getattr(b, name) for name in NodeArrays.LISTS)
    labels = a.label_columns.keys() == b.label_columns.keys() and all(
        a.label_columns[key][0] == b.label_columns[key][0]
        and np.array_equal(a.label_columns[key][1], b.label_columns[key][1])
        for key in a.label_columns
    )
    return columns and lists and labels and a.index == b.index
