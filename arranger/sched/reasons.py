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
SHARES_NOT_ENFORCED = "GPU shares not enforced there"
SHARES_FAILING = "GPU share enforcement failing there"
CONTAINER_SHARE_REFUSED = "GPU shares held there (MPS): a container may have whole GPUs only"
INSUFFICIENT_CPU = "insufficient cpu"
INSUFFICIENT_MEMORY = "insufficient memory"
INSUFFICIENT_GPU = "insufficient gpu"
GPU_UNHEALTHY = "GPUs unhealthy there"  # they alone keep the pod's GPUs out

# Reason codes of a job's decision (JobDecision.reason).
UNSCHEDULABLE = "Unschedulable"
INFEASIBLE = "Infeasible"
QUEUE_CAPABILITY = "QueueAtCapability"
SCHEDULE_TIMEOUT = "ScheduleTimeout"
PREEMPTING = "Preempting"
RESERVING = "Reserving"
WAITING_FOR_WORKERS = "WaitingForResources"

# Why preempt or reclaim evicted nothing for a job whose minimum waits (Refusal.reason). The
# per-victim ones come from the plugins' preemptable, reclaimable and evictable rules.
PREEMPTION_NOT_TRIED = "PreemptionNotTried"  # the action is off, or the job was not admitted
NO_VICTIMS = "NoPreemptionVictims"  # no other job holds running pods
VICTIM_NOT_LOWER_PRIORITY = "VictimNotLowerPriority"
VICTIM_OPTED_OUT = "VictimOptedOut"  # preemptible: false, at or above the configured priority
VICTIM_QUEUE_NOT_ABOVE_SHARE = "VictimQueueNotAboveShare"
QUEUE_NOT_BELOW_SHARE = "QueueNotBelowShare"  # reclaim: the job's own queue is not below its share
# preempt: the victim is of another queue while the job's own queue is not below its share
OWN_QUEUE_NOT_BELOW_SHARE = "OwnQueueNotBelowShare"
SAME_QUEUE = "ReclaimFromOwnQueue"  # reclaim takes only from other queues
# the victim's queue would end below its share in a resource, the taker's above its own in it
WOULD_CROSS_SHARES = "WouldCrossShares"
RAN_TOO_BRIEFLY = "VictimRanTooBriefly"  # it has run less than its queue's minRunSeconds
EVICTION_MAKES_NO_ROOM = "EvictionMakesNoRoom"  # the allowed victims gone, it still does not fit

# How a refusal counts the jobs refused for one reason ({n}: how many).
REFUSED_VICTIMS = {
    PREEMPTION_NOT_TRIED: "no plugin lets it evict anything",
    NO_VICTIMS: "no other job is running",
    VICTIM_NOT_LOWER_PRIORITY: "{n} running jobs not of lower priority",
    VICTIM_OPTED_OUT: "{n} opted out (preemptible: false)",
    VICTIM_QUEUE_NOT_ABOVE_SHARE: "{n} in queues not above their deserved share",
    OWN_QUEUE_NOT_BELOW_SHARE: "{n} in other queues, and its queue is not below its deserved share",
    QUEUE_NOT_BELOW_SHARE: "its queue is not below its deserved share",
    SAME_QUEUE: "{n} of its own queue (reclaim takes only from other queues)",
    WOULD_CROSS_SHARES: (
        "{n} would go below their queue's deserved share while its queue went above its own"
    ),
    RAN_TOO_BRIEFLY: "{n} have run less than their queue's minRunSeconds",
    EVICTION_MAKES_NO_ROOM: "evicting the {n} it may take would not make room for its minimum",
}


def render(
    pod: str, total_nodes: int, counts: Mapping[str, int], gpu_type: str = "", minimum: bool = True
) -> str:
    """render says, for one pod, how many nodes fit and why the others do not."""
    what = f"pod {pod} of the gang minimum" if minimum else f"pod {pod}"
    if total_nodes == 0:
        return f"{what}: no nodes have joined the cluster"
    parts = [f"{n} {reason.format(gpu_type=gpu_type)}" for reason, n in counts.items() if n > 0]
    return f"0/{total_nodes} nodes fit {what}: " + ", ".join(parts)
