"""binpack: the BinPack (and Gang) score (DESIGN §4.3), and the utilisation it is made of.

Let u_r = (used_r + request_r) / allocatable_r on a node after placement, r in cpu, memory, gpu.
BinPack scores sum_r w_r u_r / sum_r w_r over the resources the pod requests: fill busy nodes
first so whole nodes stay free for gangs. Weights cpu 1, memory 1, gpu 3. Higher is better;
ties go to the node first by name.
"""

from __future__ import annotations

from arranger.sched.config import ScoreWeights
from arranger.sched.framework import Plugin, plugin
from arranger.sched.nodes import FloatArray, Index, NodeArrays
from arranger.sched.snapshot import JobInfo, PodRequest
from arranger.states import BasicPolicy


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
