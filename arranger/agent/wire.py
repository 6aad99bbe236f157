"""wire: the agent's messages to and from the server, made and read here and in agent (the
session), the only modules of the agent that know the wire: orders become `orders`' values,
runs and usage become reports.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from arranger.agent.node import GpuSharing
from arranger.agent.orders import GpuGrant, KillOrder, LaunchOrder, Package, Volume
from arranger.agent.runs import PodRun
from arranger.agent.usage import PodUse
from arranger.v1 import agent_pb2, node_pb2


def launch_order(msg: agent_pb2.LaunchPod) -> LaunchOrder:
    """launch_order: the order as the agent holds it (an empty package hash: no package)."""
    package = Package(msg.package.sha256, msg.package.size) if msg.package.sha256 else None
    return LaunchOrder(
        uid=msg.pod_uid,
        attempt=msg.attempt,
        job_id=msg.job_id,
        job_name=msg.job_name,
        pod_name=msg.pod_name,
        command=tuple(msg.command),
        args=tuple(msg.args),
        env=dict(msg.env),
        working_dir=msg.working_dir,
        gpus=tuple(GpuGrant(g.index, g.share) for g in msg.gpus),
        ports=dict(msg.ports),
        readiness_port=msg.readiness_port,
        volumes=tuple(Volume(v.name, v.host_path, v.mount_path, v.read_only) for v in msg.volumes),
        cpu_cores=msg.cpu,
        memory_bytes=msg.memory,
        image=msg.image,
        grace_s=msg.grace_s,
        leader_port_name=msg.leader_port_name,
        owner=msg.owner,
        package=package,
        pids=msg.pids,
    )


def kill_order(msg: agent_pb2.KillPod) -> KillOrder:
    return KillOrder(msg.pod_uid, msg.attempt, msg.grace_s, msg.remove_scratch)


def pod_report(run: PodRun) -> agent_pb2.PodReport:
    """pod_report: how the attempt stands, as the server is told."""
    msg = agent_pb2.PodReport(
        pod_uid=run.uid,
        attempt=run.attempt,
        state=run.state.value,
        pid=run.pid,
        reason=run.reason,
        ports=run.ports,
        start_time=run.start_time,
        finish_time=run.finish_time,
    )
    if run.exit_code is not None:
        msg.exit_code = run.exit_code
    return msg


def usage_report(uses: Iterable[PodUse]) -> agent_pb2.UsageReport:
    """usage_report: the samples as the agent sends them."""
    report = agent_pb2.UsageReport()
    for use in uses:
        pod = report.pods.add(pod_uid=use.uid, attempt=use.attempt)
        pod.usage.cpu_cores = use.cpu_cores
        pod.usage.memory_bytes = use.memory_bytes
        pod.usage.memory_peak_bytes = use.memory_peak_bytes
        for gpu in use.gpus:
            pod.usage.gpus.add(
                index=gpu.index,
                utilization=gpu.utilization,
                memory_bytes=gpu.memory_bytes,
                whole_gpu=gpu.whole_gpu,
            )
    return report


def problem_messages(problems: Mapping[int, str]) -> list[agent_pb2.GpuProblem]:
    """problem_messages: the unhealthy GPUs as Register and Heartbeat carry them."""
    return [agent_pb2.GpuProblem(index=i, reason=r) for i, r in problems.items()]


def sharing_message(sharing: GpuSharing) -> node_pb2.GpuSharing:
    return node_pb2.GpuSharing(
        enforced=sharing.enforced,
        isolation=sharing.isolation,
        isolation_detail=sharing.isolation_detail,
    )
