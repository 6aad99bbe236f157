"""scores: how nodes are ranked for a pod by its job's basicPolicy (DESIGN §4.3).

Let u_r = (used_r + request_r) / allocatable_r on a node after placement, r in cpu, memory, gpu.
- BinPack (also Gang): sum_r w_r u_r / sum_r w_r over the resources the pod requests; fill busy
  nodes first so whole nodes stay free for gangs. Weights cpu 1, memory 1, gpu 3.
- LeaderFirst: the leader scores 1 - sum_r w_r u_r / sum_r w_r over all three resources with
  the GPU weight raised (cpu 1, memory 1, gpu 6): the least utilised node, so the learner is not
  crowded; workers score sum_r w_r u_r / sum_r w_r with the CPU weight raised (cpu 3, memory 1,
  gpu 1): the most utilised node, so actors pack.
- MinFragment: see minfragment.py.
- gpupreference adds a bonus (1) to nodes that have the pod's preferredGpuType.
Higher is better; ties go to the node first by name.
"""

from __future__ import annotations

import numpy as np

from arranger.sched.config import ScoreWeights
from arranger.sched.framework import Plugin, plugin
from arranger.sched.nodes import FloatArray, Index, NodeArrays
from arranger.sched.snapshot import JobInfo, PodRequest
from arranger.states import BasicPolicy, Role


def weighted_util(
    nodes: NodeArrays, pod: PodRequest, at: Index, w: ScoreWeights, requested_only: bool
) -> FloatArray:
    """weighted_util: sum_r w_r u_r / sum_r w_r after placing the pod on the nodes at `at`."""
    cpu, mem, gpu = nodes.util_after(pod, at)
    total: FloatArray = 0.0  # type: ignore[assignment]  # broadcasts to the shape of the utils
    weights = 0.0
    for weight, util, request in (
        (w.cpu, cpu, pod.cpu_milli),
        (w.memory, mem, pod.memory_bytes),
        (w.gpu, gpu, pod.gpu_milli),
    ):
        if weight > 0 and (request > 0 or not requested_only):
            total = total + weight * util
            weights += weight
    if not weights:
        return cpu * 0.0  # nothing requested: every node scores 0
    return total / weights


@plugin
class BinPack(Plugin):
    name = "binpack"

    def open(self) -> None:
        nodes, weights = self.session.nodes, self.session.config.binpack

        def score(pod: PodRequest, job: JobInfo, at: Index) -> FloatArray:
            return weighted_util(nodes, pod, at, weights, requested_only=True)

        self.session.scorers[BasicPolicy.BINPACK] = score
        self.session.scorers[BasicPolicy.GANG] = score


@plugin
class LeaderFirst(Plugin):
    name = "leaderfirst"

    def open(self) -> None:
        nodes, config = self.session.nodes, self.session.config

        def score(pod: PodRequest, job: JobInfo, at: Index) -> FloatArray:
            if pod.role == Role.LEADER:
                return 1.0 - weighted_util(
                    nodes, pod, at, config.leader_first_leader, requested_only=False
                )
            return weighted_util(nodes, pod, at, config.leader_first_worker, requested_only=False)

        self.session.scorers[BasicPolicy.LEADER_FIRST] = score


@plugin
class GpuPreference(Plugin):
    name = "gpupreference"

    def open(self) -> None:
        nodes, bonus = self.session.nodes, self.session.config.preferred_gpu_bonus
        cache: dict[str, FloatArray] = {}

        def term(pod: PodRequest, job: JobInfo, at: Index) -> FloatArray:
            if not pod.preferred_gpu_type:
                return 0.0  # type: ignore[return-value]  # adds nothing, whatever the shape
            found = cache.get(pod.preferred_gpu_type)
            if found is None:
                found = np.array(
                    [bonus * (pod.preferred_gpu_type in m) for m in nodes.model_sets],
                    dtype=np.float64,
                )
                cache[pod.preferred_gpu_type] = found
            part: FloatArray = found[at]
            return part

        self.session.score_terms.append(term)
