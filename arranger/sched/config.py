"""config holds the scheduler's tunables: which actions run, which plugins in which tiers, and
the weights of the scores. The server reads them from its scheduler config file (YAML, keys as
in `from_mapping`); every key has a default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_ACTIONS = ("enqueue", "allocate", "preempt", "reclaim", "backfill", "reserve")
DEFAULT_TIERS = (
    ("priority", "gang", "drf"),
    (
        "predicates",
        "proportion",
        "binpack",
        "leaderfirst",
        "minfragment",
        "affinity",
        "gpupreference",
    ),
)
MACHINE_GROUP_LABEL = "arranger.io/machine-group"


class SchedulerConfigError(ValueError):
    """SchedulerConfigError names the setting that is wrong."""


@dataclass(frozen=True, slots=True)
class ScoreWeights:
    """ScoreWeights weigh each resource's utilisation in a score."""

    cpu: float = 1.0
    memory: float = 1.0
    gpu: float = 3.0


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """SchedulerConfig.

    - `actions`: the cycle's steps, in order.
    - `tiers`: enabled plugins; job-order keys are taken tier by tier, plugin by plugin.
    - `binpack`: BinPack weights (GPUs weigh most: whole free GPU nodes are what gangs need).
    - `leader_first_leader` / `leader_first_worker`: LeaderFirst weights; the leader goes to the
      least utilised node with the GPU weight raised, workers to the most utilised with the CPU
      weight raised.
    - `stranding_weight`: MinFragment's weight of the GPU-stranding term.
    - `preferred_gpu_bonus`: added to a node's score when it has the pod's preferredGpuType.
    - `scarce_gpu_types`: GPU models whose nodes take only pods that ask for that model.
    - `machine_group_label`: the node label naming a node's private machine group.
    - `infeasible_timeout_s`: how long a job that cannot fit even the empty cluster waits
      (nodes may still be joining) before it is ScheduledFailed.
    - `starvation_threshold_s`: a job waiting this long may get a reservation (nodes locked for
      it, one more each cycle, until its minimum fits).
    - `opt_out_min_priority`: `preemptible: false` is honoured only for jobs of at least this
      priority, so low-priority work cannot shield itself.
    - `enforced_shares_only`: a share of a GPU goes only to nodes whose agent holds shares to
      their limits (gpuSharing.enforced); off, to any node but one that lost its enforcement.
    """

    actions: tuple[str, ...] = DEFAULT_ACTIONS
    tiers: tuple[tuple[str, ...], ...] = DEFAULT_TIERS
    binpack: ScoreWeights = ScoreWeights()
    leader_first_leader: ScoreWeights = ScoreWeights(1.0, 1.0, 6.0)
    leader_first_worker: ScoreWeights = ScoreWeights(3.0, 1.0, 1.0)
    stranding_weight: float = 0.25
    preferred_gpu_bonus: float = 1.0
    scarce_gpu_types: frozenset[str] = field(default_factory=frozenset)
    machine_group_label: str = MACHINE_GROUP_LABEL
    infeasible_timeout_s: float = 60.0
    starvation_threshold_s: float = 300.0
    opt_out_min_priority: int = 8
    enforced_shares_only: bool = False

    @property
    def plugins(self) -> tuple[str, ...]:
        return tuple(name for tier in self.tiers for name in tier)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> SchedulerConfig:
        """from_mapping reads the scheduler config file's contents:

        actions: [enqueue, allocate, backfill]
        tiers:
          - plugins: [priority, gang, drf]
          - plugins: [predicates, proportion, binpack, leaderfirst, minfragment, affinity, gpupreference]
        weights:
          binpack: {cpu: 1, memory: 1, gpu: 3}
          leaderFirstLeader: {cpu: 1, memory: 1, gpu: 6}
          leaderFirstWorker: {cpu: 3, memory: 1, gpu: 1}
          stranding: 0.25
          preferredGpuType: 1
        scarceGpuTypes: [A100]
        machineGroupLabel: arranger.io/machine-group
        infeasibleTimeoutSeconds: 60
        enforcedSharesOnly: false
        """
        known = {
            "actions",
            "tiers",
            "weights",
            "scarceGpuTypes",
            "machineGroupLabel",
            "infeasibleTimeoutSeconds",
            "starvationThresholdSeconds",
            "preemptionOptOutMinPriority",
            "enforcedSharesOnly",
        }
        unknown = set(raw) - known
        if unknown:
            raise SchedulerConfigError(f"unknown settings: {', '.join(sorted(unknown))}")
        base = cls()
        try:
            weights = dict(raw.get("weights") or {})
            config = cls(
                actions=tuple(str(a) for a in raw.get("actions", base.actions)),
                tiers=tuple(tuple(str(p) for p in tier["plugins"]) for tier in raw.get("tiers", []))
                or base.tiers,
                binpack=_weights(weights.get("binpack"), base.binpack),
                leader_first_leader=_weights(
                    weights.get("leaderFirstLeader"), base.leader_first_leader
                ),
                leader_first_worker=_weights(
                    weights.get("leaderFirstWorker"), base.leader_first_worker
                ),
                stranding_weight=float(weights.get("stranding", base.stranding_weight)),
                preferred_gpu_bonus=float(
                    weights.get("preferredGpuType", base.preferred_gpu_bonus)
                ),
                scarce_gpu_types=frozenset(str(t) for t in raw.get("scarceGpuTypes", ())),
                machine_group_label=str(raw.get("machineGroupLabel", base.machine_group_label)),
                infeasible_timeout_s=float(
                    raw.get("infeasibleTimeoutSeconds", base.infeasible_timeout_s)
                ),
                starvation_threshold_s=float(
                    raw.get("starvationThresholdSeconds", base.starvation_threshold_s)
                ),
                opt_out_min_priority=int(
                    raw.get("preemptionOptOutMinPriority", base.opt_out_min_priority)
                ),
                enforced_shares_only=_flag(raw, "enforcedSharesOnly", base.enforced_shares_only),
            )
        except (TypeError, ValueError, KeyError) as exc:
            raise SchedulerConfigError(f"scheduler config: {exc}") from exc
        config.check()
        return config

    def check(self) -> None:
        """check refuses names no action or plugin answers to."""
        from arranger.sched.framework import ACTIONS, PLUGINS  # noqa: PLC0415 (registries import this)

        for action in self.actions:
            if action not in ACTIONS:
                raise SchedulerConfigError(
                    f"actions: unknown action {action!r}; known: {', '.join(sorted(ACTIONS))}"
                )
        for plugin in self.plugins:
            if plugin not in PLUGINS:
                raise SchedulerConfigError(
                    f"tiers: unknown plugin {plugin!r}; known: {', '.join(sorted(PLUGINS))}"
                )


def _weights(raw: Any, default: ScoreWeights) -> ScoreWeights:
    if raw is None:
        return default
    values = dict(raw)
    unknown = set(values) - {"cpu", "memory", "gpu"}
    if unknown:
        raise KeyError(f"weights: unknown resource {sorted(unknown)[0]!r}")
    return ScoreWeights(
        float(values.get("cpu", default.cpu)),
        float(values.get("memory", default.memory)),
        float(values.get("gpu", default.gpu)),
    )


def _flag(raw: Mapping[str, Any], key: str, default: bool) -> bool:
    """_flag: a true/false setting (a string such as "false" is refused, not taken as true)."""
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise SchedulerConfigError(f"{key}: must be true or false, not {value!r}")
    return value
