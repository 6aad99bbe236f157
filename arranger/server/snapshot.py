"""snapshot builds the scheduling core's input from the controller's records."""

from __future__ import annotations

from arranger.sched import (
    GpuInfo,
    JobInfo,
    NodeInfo,
    PodRequest,
    Res,
    Snapshot,
)
from arranger.sched.snapshot import RunningPod
from arranger.server.controller import Controller
from arranger.server.model import IN_PLACE, JobRecord
from arranger.states import NodeState, PodState


def build_snapshot(controller: Controller, now: float) -> Snapshot:
    """build_snapshot: every node with what its pods hold (pods being stopped included), every
    queue with what its jobs hold, and every job that holds resources or waits for them. Pods
    being stopped are marked terminating (the core counts on their room coming free), except
    those stopped to run again on the same node. An ended job is there only with the pods it
    is stopping; processes left running by cleanPodPolicy None count for its queue."""
    used_cpu: dict[str, int] = {}
    used_mem: dict[str, int] = {}
    used_gpu: dict[tuple[str, int], int] = {}
    queue_used: dict[str, Res] = {}
    jobs: list[JobInfo] = []
    for job in controller.jobs.values():
        spec = job.spec
        active = _schedulable(job)
        pending: list[PodRequest] = []
        running: list[RunningPod] = []
        held = Res()
        outside = Res()  # held by an ended job's processes that run on (cleanPodPolicy None)
        for pod in job.pods.values():
            template = spec.template_of(pod.worker_set)
            res = template.resources
            if pod.state.holds_resources:
                used_cpu[pod.node] = used_cpu.get(pod.node, 0) + res.cpu_milli
                used_mem[pod.node] = used_mem.get(pod.node, 0) + res.memory_bytes
                for share in pod.gpus:
                    key = (pod.node, share.index)
                    used_gpu[key] = used_gpu.get(key, 0) + share.milli
                request = Res(res.cpu_milli, res.memory_bytes, res.gpu_milli)
                # A pod being stopped to run again on the same node keeps its room.
                leaving = pod.stopping and pod.requeue != IN_PLACE
                if not active and not leaving:
                    outside = outside + request
                    continue
                held = held + request
                running.append(
                    RunningPod(
                        name=pod.name, node=pod.node, request=request, gpus=pod.gpus,
                        role=pod.role, in_minimum=pod.in_minimum, start_time=pod.start_time,
                        terminating=leaving,
                    )
                )  # fmt: skip
            elif pod.state == PodState.PENDING and not pod.done and active:
                pending.append(
                    PodRequest(
                        name=pod.name, role=pod.role, rank=pod.rank, cpu_milli=res.cpu_milli,
                        memory_bytes=res.memory_bytes, gpu_milli=res.gpu_milli,
                        gpu_type=res.gpu_type, node_selector=template.node_selector,
                        in_minimum=pod.in_minimum, worker_set=pod.worker_set,
                        preferred_gpu_type=res.preferred_gpu_type, container=bool(template.image),
                    )
                )  # fmt: skip
        if outside != Res():
            queue_used[spec.queue] = queue_used.get(spec.queue, Res()) + outside
        if pending or running:  # an ended job appears only with the pods it is stopping
            jobs.append(
                JobInfo(
                    id=job.id, name=spec.name, queue=spec.queue, priority=spec.priority,
                    submit_time=job.submit_time, pending=tuple(pending), running=tuple(running),
                    basic_policy=spec.basic_policy, job_queue_policy=spec.job_queue_policy,
                    infeasible_since=job.infeasible_since, allocated=held,
                    schedule_timeout_s=spec.schedule_timeout_s,
                    machine_group_only=spec.machine_group_only,
                    waiting_since=job.waiting_since if job.waiting_since is not None else job.submit_time,
                    preemptible=spec.preemptible, start_time=job.start_time,
                    max_runtime_s=spec.max_runtime_s,
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
            containers=node.runs_images,
        )
        for node in sorted(controller.nodes.values(), key=lambda n: n.name)
    )
    queues = tuple(q.info(queue_used.get(q.name, Res())) for q in controller.queues.values())
    return Snapshot(
        now=now, nodes=nodes, jobs=tuple(jobs), queues=queues, reservation=controller.reservation
    )


def _schedulable(job: JobRecord) -> bool:
    return not (job.deleted or job.terminating or job.stage.finished)
