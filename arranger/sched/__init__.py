"""sched is the scheduling core: pure, synchronous, deterministic; snapshot in, plan out.

No I/O, no asyncio, no protobuf, no wall clock: `Snapshot.now` is the only time it sees.
Actions (enqueue, allocate, backfill) decide what happens in what order; plugins (priority,
drf, gang, proportion, predicates, binpack, leaderfirst, minfragment, affinity, gpupreference)
are the policy. SchedulerConfig says which run, in which tiers.
"""

from arranger.sched.cluster import Snapshot
from arranger.sched.config import SchedulerConfig, SchedulerConfigError, ScoreWeights
from arranger.sched.cycle import run_cycle
from arranger.sched.plan import GpuShare, JobDecision, Placement, Plan
from arranger.sched.resources import UNLIMITED, Res
from arranger.sched.snapshot import (
    GPU_MILLI,
    NO_CAPABILITY,
    GpuInfo,
    JobInfo,
    NodeInfo,
    PodRequest,
    QueueInfo,
)

__all__ = [
    "GPU_MILLI",
    "NO_CAPABILITY",
    "UNLIMITED",
    "GpuInfo",
    "GpuShare",
    "JobDecision",
    "JobInfo",
    "NodeInfo",
    "Placement",
    "Plan",
    "PodRequest",
    "QueueInfo",
    "Res",
    "SchedulerConfig",
    "SchedulerConfigError",
    "ScoreWeights",
    "Snapshot",
    "run_cycle",
]
