"""reasons names why a node cannot take a pod, and renders the aggregate a human can act on.

Filters run in the order below; a node is counted under the first filter it fails, so the
counts of one message add up to the number of nodes.
"""

from __future__ import annotations

from collections.abc import Mapping

NODE_UNSCHEDULABLE = "not ready or cordoned"
SELECTOR_MISMATCH = "nodeSelector mismatch"
GPU_TYPE_MISMATCH = "gpuType {gpu_type} wanted"
INSUFFICIENT_CPU = "insufficient cpu"
INSUFFICIENT_MEMORY = "insufficient memory"
INSUFFICIENT_GPU = "insufficient gpu"

FILTER_ORDER = (
    NODE_UNSCHEDULABLE,
    SELECTOR_MISMATCH,
    GPU_TYPE_MISMATCH,
    INSUFFICIENT_CPU,
    INSUFFICIENT_MEMORY,
    INSUFFICIENT_GPU,
)

# Reason codes of a job's decision (JobDecision.reason).
UNSCHEDULABLE = "Unschedulable"
INFEASIBLE = "Infeasible"
WAITING_FOR_WORKERS = "WaitingForResources"


def render(pod: str, total_nodes: int, counts: Mapping[str, int], gpu_type: str = "") -> str:
    """render says, for one pod, how many nodes fit and why the others do not."""
    if total_nodes == 0:
        return f"pod {pod}: no nodes have joined the cluster"
    parts = [
        f"{counts[r]} {r.format(gpu_type=gpu_type)}" for r in FILTER_ORDER if counts.get(r, 0) > 0
    ]
    return f"0/{total_nodes} nodes fit pod {pod}: " + ", ".join(parts)
