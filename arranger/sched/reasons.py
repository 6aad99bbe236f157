"""reasons names why a node cannot take a pod, and renders the aggregate a human can act on.

Filters run in order; a node is counted under the first filter it fails, so the counts of one
message add up to the number of nodes.
"""

from __future__ import annotations

from collections.abc import Mapping

NODE_UNSCHEDULABLE = "not ready or cordoned"
SELECTOR_MISMATCH = "nodeSelector mismatch"
NO_CONTAINER_RUNTIME = "no container runtime for the image"
GPU_TYPE_MISMATCH = "gpuType {gpu_type} wanted"
SCARCE_GPU = "reserved for scarce GPU jobs"
MACHINE_GROUP = "in another machine group"
SHARED_NODE = "not in the queue's machine groups"
RESERVED = "reserved for a starving job"
INSUFFICIENT_CPU = "insufficient cpu"
INSUFFICIENT_MEMORY = "insufficient memory"
INSUFFICIENT_GPU = "insufficient gpu"

# Reason codes of a job's decision (JobDecision.reason).
UNSCHEDULABLE = "Unschedulable"
INFEASIBLE = "Infeasible"
QUEUE_CAPABILITY = "QueueAtCapability"
SCHEDULE_TIMEOUT = "ScheduleTimeout"
PREEMPTING = "Preempting"
RESERVING = "Reserving"
WAITING_FOR_WORKERS = "WaitingForResources"


def render(
    pod: str, total_nodes: int, counts: Mapping[str, int], gpu_type: str = "", minimum: bool = True
) -> str:
    """render says, for one pod, how many nodes fit and why the others do not."""
    what = f"pod {pod} of the gang minimum" if minimum else f"pod {pod}"
    if total_nodes == 0:
        return f"{what}: no nodes have joined the cluster"
    parts = [f"{n} {reason.format(gpu_type=gpu_type)}" for reason, n in counts.items() if n > 0]
    return f"0/{total_nodes} nodes fit {what}: " + ", ".join(parts)
