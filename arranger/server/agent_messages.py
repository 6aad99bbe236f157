"""agent_messages: the agent stream's messages as records (a registration, pod reports, GPU
problems) and the controller's orders as messages (launches, kills, a batch of commands per
node). With convert (the client API's), the one place where wire messages become records and
records become messages.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping

from arranger.server.effects import Effects, KillOrder, LaunchOrder
from arranger.server.model import GpuRecord, GpuSharing
from arranger.server.nodes import NodeRegistration, PodReport
from arranger.states import PodState
from arranger.v1 import agent_pb2

_AGENT_ID = re.compile(r"[0-9a-f]{0,64}")
_JOB_ID = re.compile(r"[0-9a-f]{1,64}")
KEPT_JOBS_MOST = 100_000


def registration_from_proto(reg: agent_pb2.Register) -> NodeRegistration:
    """registration_from_proto: the node as its agent registers it, with the first
    KEPT_JOBS_MOST of the jobs it keeps whose ids are ids; a ValueError for an agent id that is
    not one."""
    if not _AGENT_ID.fullmatch(reg.agent_id):
        raise ValueError(f"agentId: {reg.agent_id[:80]!r} is not an agent id (hex, 64 at most)")
    problems = gpu_problems_of(reg.gpu_problems)
    return NodeRegistration(
        name=reg.node_name,
        address=reg.address,
        cpu_milli=round(reg.capacity.cpu * 1000),
        memory_bytes=reg.capacity.memory,
        gpus=tuple(
            GpuRecord(g.index, g.uuid, g.model, g.memory, g.fake, problems.get(g.index, ""))
            for g in reg.gpus
        ),
        labels=dict(reg.labels),
        pods=tuple(report_from_proto(r) for r in reg.pods),
        agent_version=reg.agent_version,
        runtimes=tuple(reg.runtimes),
        gpu_sharing=_gpu_sharing(reg),
        agent_id=reg.agent_id,
        kept_jobs=tuple(j for j in reg.kept_jobs[:KEPT_JOBS_MOST] if _JOB_ID.fullmatch(j)),
        sent_at=reg.sent_at if math.isfinite(reg.sent_at) else 0.0,
    )


GPU_PROBLEM_CHARS = 200  # the most of an agent's reason for an unhealthy GPU that is kept


def gpu_problems_of(said: Iterable[agent_pb2.GpuProblem]) -> dict[int, str]:
    """gpu_problems_of: the unhealthy GPUs an agent names, by index, and why (cut to
    GPU_PROBLEM_CHARS; "unhealthy" where it gives no reason: "" would say it is healthy)."""
    return {p.index: p.reason[:GPU_PROBLEM_CHARS] or "unhealthy" for p in said}


def _gpu_sharing(reg: agent_pb2.Register) -> GpuSharing | None:
    """_gpu_sharing: what the agent says of GPU sharing (None: an agent that does not say)."""
    if not reg.HasField("gpu_sharing"):
        return None
    said = reg.gpu_sharing
    return GpuSharing(said.enforced, said.isolation, said.isolation_detail)


def report_from_proto(report: agent_pb2.PodReport) -> PodReport:
    return PodReport(
        pod_uid=report.pod_uid,
        attempt=report.attempt,
        state=PodState(report.state),
        pid=report.pid,
        exit_code=report.exit_code if report.HasField("exit_code") else None,
        reason=report.reason,
        ports=dict(report.ports),
        start_time=report.start_time or None,
        finish_time=report.finish_time or None,
    )


def launch_to_proto(order: LaunchOrder) -> agent_pb2.LaunchPod:
    msg = agent_pb2.LaunchPod(
        pod_uid=order.pod_uid,
        attempt=order.attempt,
        job_id=order.job_id,
        job_name=order.job_name,
        pod_name=order.pod_name,
        command=order.command,
        args=order.args,
        env=dict(order.env),
        working_dir=order.working_dir,
        ports=dict(order.ports),
        readiness_port=order.readiness_port,
        cpu=order.cpu_milli / 1000,
        memory=order.memory_bytes,
        image=order.image,
        grace_s=order.grace_s,
        leader_port_name=order.leader_port_name,
        owner=order.owner,
        pids=order.pids,
    )
    if order.package is not None:
        msg.package.sha256, msg.package.size = order.package.sha256, order.package.size
    for share in order.gpus:
        msg.gpus.add(index=share.index, share=share.milli / 1000)
    for name, host_path, mount_path, read_only in order.volumes:
        msg.volumes.add(name=name, host_path=host_path, mount_path=mount_path, read_only=read_only)
    return msg


def kill_to_proto(order: KillOrder) -> agent_pb2.KillPod:
    return agent_pb2.KillPod(
        pod_uid=order.pod_uid,
        attempt=order.attempt,
        grace_s=order.grace_s,
        reason=order.reason,
        remove_scratch=order.remove_scratch,
    )


def commands_of(
    fx: Effects,
    connected: Iterable[str],
    epoch: int,
    job_env: Callable[[str], Mapping[str, str]] = lambda job_id: {},
) -> dict[str, agent_pb2.Commands]:
    """commands_of: the orders of stored effects, one batch per node, each marked with the
    sending server's epoch; a purge goes to every `connected` node. A launched pod's
    environment gets `job_env(job id)` too (what reaches the API as the job: never stored)."""
    batches: dict[str, agent_pb2.Commands] = defaultdict(lambda: agent_pb2.Commands(epoch=epoch))
    for launch in fx.launches:
        msg = launch_to_proto(launch)
        msg.env.update(job_env(launch.job_id))
        batches[launch.node].launch.append(msg)
    for kill in fx.kills:
        batches[kill.node].kill.append(kill_to_proto(kill))
    for node, uid in fx.forgets:
        batches[node].forget_pods.append(uid)
    if fx.purges:
        for node in connected:
            batches[node].purge_jobs.extend(fx.purges)
    return batches
