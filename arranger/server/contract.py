"""contract builds what a launched process gets (DESIGN §6), the server's half of it.

The server sets what it knows: the job, the pod's role and rank, the leader's address, the
restart count and volume paths. The agent adds what only it knows: ARRANGER_NODE_NAME, one
ARRANGER_PORT_<NAME> per allocated port, ARRANGER_SCRATCH_DIR and CUDA_VISIBLE_DEVICES, and
for a leader its own address as ARRANGER_LEADER_HOST/PORT/ADDR.
"""

from __future__ import annotations

from arranger.server.effects import LaunchOrder
from arranger.server.model import JobRecord, NodeRecord, PodRecord
from arranger.spec import env_name
from arranger.states import Role
from arranger.sweep import sweep_env


def launch_order(
    job: JobRecord, pod: PodRecord, node: NodeRecord, grace_s: float, preemption_grace_s: float
) -> LaunchOrder:
    """launch_order: `grace_s` is the SIGTERM-to-SIGKILL time of an ordinary stop;
    `preemption_grace_s` that of an eviction, exported as ARRANGER_PREEMPTION_GRACE_S."""
    spec = job.spec
    is_leader = pod.role == Role.LEADER
    template = (
        spec.leader
        if is_leader
        else next(ws.template for ws in spec.worker_sets if ws.name == pod.worker_set)
    )
    env = dict(template.env)
    env.update(
        ARRANGER_JOB_NAME=spec.name,
        ARRANGER_JOB_ID=job.id,
        ARRANGER_POD_NAME=pod.name,
        ARRANGER_ROLE=str(pod.role),
        ARRANGER_WORKER_SET=pod.worker_set,
        ARRANGER_WORKER_INDEX=str(pod.index if not is_leader else -1),
        ARRANGER_WORKER_RANK=str(pod.rank),
        ARRANGER_NUM_WORKERS=str(spec.num_workers),
        ARRANGER_RESTART_COUNT=str(pod.attempt),
        ARRANGER_PREEMPTION_GRACE_S=f"{preemption_grace_s:g}",
    )
    if not is_leader:
        host, _, port = job.leader_address.rpartition(":")
        env.update(
            ARRANGER_LEADER_HOST=host,
            ARRANGER_LEADER_PORT=port,
            ARRANGER_LEADER_ADDR=job.leader_address,
        )
    for volume in spec.volumes:
        env[f"ARRANGER_VOLUME_{env_name(volume.name)}"] = volume.host_path
    env.update(sweep_env(spec))
    ports = {name: pod.ports.get(name, 0) for name in template.ports}
    return LaunchOrder(
        node=node.name,
        pod_uid=pod.uid,
        attempt=pod.attempt,
        job_id=job.id,
        job_name=spec.name,
        pod_name=pod.name,
        command=template.command,
        args=template.args,
        env=env,
        working_dir=template.working_dir,
        gpus=pod.gpus,
        ports=ports,
        readiness_port=template.readiness_port,
        volumes=tuple((v.name, v.host_path, v.mount_path, v.read_only) for v in spec.volumes),
        cpu_milli=template.resources.cpu_milli,
        memory_bytes=template.resources.memory_bytes,
        image=template.image,
        grace_s=grace_s,
        leader_port_name=template.ports[0] if is_leader else "",
        owner=job.owner,
        package=spec.package,
        pids=template.resources.pids,
    )
