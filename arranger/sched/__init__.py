"""sched is the scheduling core: pure, synchronous, deterministic; snapshot in, plan out.

No I/O, no asyncio, no protobuf, no wall clock: `Snapshot.now` is the only time it sees.
"""

from arranger.sched.config import SchedulerConfig, ScoreWeights
from arranger.sched.cycle import run_cycle
from arranger.sched.plan import GpuShare, JobDecision, Placement, Plan
from arranger.sched.snapshot import GPU_MILLI, GpuInfo, JobInfo, NodeInfo, PodRequest, Snapshot

__all__ = [
    "GPU_MILLI",
    "GpuInfo",
    "GpuShare",
    "JobDecision",
    "JobInfo",
    "NodeInfo",
    "Placement",
    "Plan",
    "PodRequest",
    "SchedulerConfig",
    "ScoreWeights",
    "Snapshot",
    "run_cycle",
]
