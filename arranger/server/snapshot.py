"""snapshot builds the scheduling core's input from the controller's records."""

from __future__ import annotations

from arranger.sched import GpuInfo, JobInfo, NodeInfo, PodRequest, Res, Snapshot
from arranger.server.controller import Controller
from arranger.server.model import JobRecord
from arranger.states import NodeState, PodState


def build_snapshot(controller: Controller, now: float) -> Snapshot:
    """build_snapshot: every node with what bound pods use, every active job with pending pods."""
    used_cpu: dict[str, int] = {}
    used_mem: dict[str, int] = {}
    used_gpu: dict[tuple[str, int], int] = {}
    queue_used: dict[str, Res] = {}
    jobs: list[JobInfo] = []
    for job in controller.jobs.values():
        spec = job.spec
        pending: list[PodRequest] = []
        bound: dict[str, str] = {}
        held = Res()
        for pod in job.pods.values():
            if pod.state.holds_resources:
                res = spec.template_of(pod.worker_set).resources
                used_cpu[pod.node] = used_cpu.get(pod.node, 0) + res.cpu_milli
                used_mem[pod.node] = used_mem.get(pod.node, 0) + res.memory_bytes
                for share in pod.gpus:
                    key = (pod.node, share.index)
                    used_gpu[key] = used_gpu.get(key, 0) + share.milli
                bound[pod.name] = pod.node
                held = held + Res(res.cpu_milli, res.memory_bytes, res.gpu_milli)
            elif pod.state == PodState.PENDING and not pod.done:
                tpl = spec.template_of(pod.worker_set)
                res = tpl.resources
                pending.append(
                    PodRequest(
                        name=pod.name, role=pod.role, rank=pod.rank, cpu_milli=res.cpu_milli,
                        memory_bytes=res.memory_bytes, gpu_milli=res.gpu_milli,
                        gpu_type=res.gpu_type, node_selector=tpl.node_selector,
                        in_minimum=pod.in_minimum, worker_set=pod.worker_set,
                        preferred_gpu_type=res.preferred_gpu_type,
                    )
                )  # fmt: skip
        queue_used[spec.queue] = queue_used.get(spec.queue, Res()) + held
        if pending and _schedulable(job):
            jobs.append(
                JobInfo(
                    id=job.id, name=spec.name, queue=spec.queue, priority=spec.priority,
                    submit_time=job.submit_time, pending=tuple(pending), bound=bound,
                    basic_policy=spec.basic_policy, job_queue_policy=spec.job_queue_policy,
                    infeasible_since=job.infeasible_since, allocated=held,
                    schedule_timeout_s=spec.schedule_timeout_s,
                    machine_group_only=spec.machine_group_only,
                )
            )  # fmt: skip
    nodes = tuple(
        NodeInfo(
            name=node.name,
            cpu_milli=node.cpu_milli,
            memory_bytes=node.memory_bytes,
            gpus=tuple(
                GpuInfo(g.index, g.model, used_gpu.get((node.name, g.index), 0)) for g in node.gpus
            ),
            used_cpu_milli=used_cpu.get(node.name, 0),
            used_memory_bytes=used_mem.get(node.name, 0),
            labels=node.labels,
            schedulable=node.schedulable,
            ready=node.state == NodeState.READY,
        )
        for node in sorted(controller.nodes.values(), key=lambda n: n.name)
    )
    queues = tuple(q.info(queue_used.get(q.name, Res())) for q in controller.queues.values())
    return Snapshot(now=now, nodes=nodes, jobs=tuple(jobs), queues=queues)


def _schedulable(job: JobRecord) -> bool:
    return not (job.deleted or job.terminating or job.stage.finished)
