"""config holds the scheduler's tunables; the server loads them from its config file."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ScoreWeights:
    """ScoreWeights weigh each resource's utilisation in BinPack; GPUs are the scarce resource."""

    cpu: float = 1.0
    memory: float = 1.0
    gpu: float = 3.0


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """SchedulerConfig: `infeasible_timeout_s` is how long a job that cannot fit even the empty
    cluster waits (nodes may still be joining) before it is ScheduledFailed."""

    weights: ScoreWeights = ScoreWeights()
    infeasible_timeout_s: float = 60.0
