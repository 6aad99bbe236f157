"""plan_check re-checks a plan against the records as they are when it comes back.

The core plans on a snapshot while the server goes on taking changes (Nomad's plan applier
does the same check): a node may have left, been cordoned, or come back smaller meanwhile.
What the pods on a node hold now comes from the kept scheduling state (refreshed from what
changed), so the check costs the plan's placements, not the pods on their nodes.
"""

from __future__ import annotations

from arranger.sched import GPU_MILLI, Plan
from arranger.sched.plan import GpuShare
from arranger.server.controller import Controller
from arranger.server.model import NodeRecord
from arranger.server.snapshot import SchedulingState

Wanted = list[tuple[str, int, int, tuple[GpuShare, ...]]]  # (job id, CPU, memory, GPU shares)


def stale_placements(controller: Controller, state: SchedulingState, plan: Plan) -> set[str]:
    """stale_placements: the jobs with a placement on a node that can no longer take it,
    as the records are now: the node left or takes no new pods, a GPU placed on has turned
    unhealthy, or what its pods hold plus the plan's placements there exceeds its CPU, memory
    or a GPU. `state` is the controller's kept scheduling state (told every change)."""
    wanted: dict[str, Wanted] = {}
    for placement in plan.placements:
        job = controller.view.job(placement.job_id)
        pod = job.pods.get(placement.pod) if job else None
        if job is None or pod is None:
            continue
        res = job.spec.template_of(pod.worker_set).resources
        wanted.setdefault(placement.node, []).append(
            (job.id, res.cpu_milli, res.memory_bytes, placement.gpus)
        )
    if wanted:
        state.refresh()
    stale: set[str] = set()
    for name, pods in wanted.items():
        node = controller.view.node(name)
        if node is None or not node.schedulable or not _room(state, node, pods):
            stale.update(job_id for job_id, *_ in pods)
    return stale


def _room(state: SchedulingState, node: NodeRecord, pods: Wanted) -> bool:
    """_room: whether the node holds what its pods hold now plus `pods` (CPU, memory, and
    each GPU up to one whole; none on an unhealthy GPU)."""
    cpu = state.cpu.get(node.name, 0) + sum(p[1] for p in pods)
    memory = state.memory.get(node.name, 0) + sum(p[2] for p in pods)
    gpus: dict[int, int] = {}
    for *_, shares in pods:
        for share in shares:
            gpus[share.index] = gpus.get(share.index, 0) + share.milli
    known = {g.index for g in node.gpus if not g.problem}
    return (
        cpu <= node.cpu_milli
        and memory <= node.memory_bytes
        and all(
            index in known and milli + state.gpus.get((node.name, index), 0) <= GPU_MILLI
            for index, milli in gpus.items()
        )
    )
