"""convert: the client API's messages (jobs, pods, nodes, events, history) made from records,
and job specs to and from their stored JSON. With agent_messages (the agent stream's), the one
place where wire messages become records and records become messages."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from google.protobuf import json_format
from google.protobuf.timestamp_pb2 import Timestamp

from arranger.sched import Res
from arranger.sched.snapshot import SHARES_ENFORCED
from arranger.server import stalls
from arranger.server.history import HistoryRecord, outcome_of
from arranger.server.model import (
    EventRecord,
    JobRecord,
    NodeRecord,
    PodRecord,
)
from arranger.server.validation import API_VERSION, KIND, parse_stored_job
from arranger.spec import JobSpec, PodTemplate, StallPolicy
from arranger.states import NodeState, PodState, Role, Stage
from arranger.sweep import experiment_of
from arranger.v1 import arranger_pb2, job_pb2, node_pb2

# Specs.


def spec_to_proto(spec: JobSpec) -> job_pb2.TYJob:
    """spec_to_proto renders a JobSpec with every default filled in."""
    msg = job_pb2.TYJob(api_version=API_VERSION, kind=KIND)
    msg.metadata.name = spec.name
    msg.metadata.queue = spec.queue
    msg.metadata.labels.update(spec.labels)
    s = msg.spec
    s.priority, s.restart_limit, s.min_workers_num = (
        spec.priority,
        spec.restart_limit,
        spec.min_workers_num,
    )
    s.clean_pod_policy = spec.clean_pod_policy.value
    s.scheduler_policy.job_queue_policy = spec.job_queue_policy.value
    s.scheduler_policy.basic_policy = spec.basic_policy.value
    s.scheduler_policy.machine_group_only = spec.machine_group_only
    if spec.schedule_timeout_s is not None:
        s.schedule_timeout_seconds = spec.schedule_timeout_s
    s.preemptible = spec.preemptible
    if spec.preemption_grace_s is not None:
        s.preemption_grace_seconds = spec.preemption_grace_s
    if spec.max_runtime_s is not None:
        s.max_runtime_seconds = spec.max_runtime_s
    if spec.eviction_notice_s:
        s.eviction_notice_seconds = spec.eviction_notice_s
    if spec.package is not None:
        s.package.sha256, s.package.size = spec.package.sha256, spec.package.size
    for dep in spec.depends_on:
        s.depends_on.add(job=dep.job, when=dep.when)
    if spec.sweep is not None:
        for key, values in spec.sweep.parameters:
            s.sweep.parameters[key].extend(values)
        s.sweep.seeds, s.sweep.max_parallel = spec.sweep.seeds, spec.sweep.max_parallel
        if spec.sweep.member is not None:
            s.sweep.member, s.sweep.seed = spec.sweep.member, spec.sweep.seed
    for vol in spec.volumes:
        s.volumes.add(
            name=vol.name,
            host_path=vol.host_path,
            mount_path=vol.mount_path,
            read_only=vol.read_only,
        )
    s.leader.name = spec.leader_name
    s.leader.retry_on_exit_codes.extend(spec.leader_retry_on_exit_codes)
    _stall_to_proto(spec.leader_stall, s.leader)
    _template_to_proto(spec.leader, s.leader.template)
    for ws in spec.worker_sets:
        out = s.worker_sets.add(
            name=ws.name, counts=ws.counts, min_count=ws.min_count, max_counts=ws.most
        )
        out.retry_on_exit_codes.extend(ws.retry_on_exit_codes)
        _stall_to_proto(ws.stall, out)
        out.auxiliary, out.start_after = ws.auxiliary, ws.start_after
        if ws.auxiliary:
            out.termination_delay_seconds = ws.termination_delay_s
        _template_to_proto(ws.template, out.template)
    return msg


def _stall_to_proto(stall: StallPolicy, out: job_pb2.Leader | job_pb2.WorkerSet) -> None:
    if stall.timeout_s is not None:
        out.progress_timeout_seconds = stall.timeout_s
        out.on_stall = stall.on_stall


def _template_to_proto(tpl: PodTemplate, out: job_pb2.PodTemplate) -> None:
    out.command.extend(tpl.command)
    out.args.extend(tpl.args)
    out.env.update(tpl.env)
    out.working_dir = tpl.working_dir
    res = tpl.resources
    out.resources.cpu = res.cpu_milli / 1000
    out.resources.memory = res.memory_bytes
    out.resources.gpu = res.gpu_milli / 1000
    out.resources.gpu_type = res.gpu_type
    out.resources.preferred_gpu_type = res.preferred_gpu_type
    out.resources.pids = res.pids
    out.node_selector.update(tpl.node_selector)
    for port in tpl.ports:
        out.ports.add(name=port)
    if tpl.readiness_port:
        out.readiness.port = tpl.readiness_port
    out.image = tpl.image


def spec_to_json(spec: JobSpec) -> str:
    return json_format.MessageToJson(spec_to_proto(spec), indent=None, sort_keys=True)


def spec_from_json(text: str) -> JobSpec:
    """spec_from_json reads a stored spec back: its structure is checked, not today's size
    limits (it was checked against those of its day when it was submitted)."""
    msg = job_pb2.TYJob()
    json_format.Parse(text, msg)
    return parse_stored_job(msg)


# Jobs.


def _timestamp(seconds: float | None, out: Timestamp) -> None:
    if seconds is not None:
        out.FromNanoseconds(int(seconds * 1e9))


def job_to_proto(job: JobRecord, host: Host = lambda node: "") -> job_pb2.TYJob:
    msg = spec_to_proto(job.spec)
    msg.metadata.id = job.id
    msg.metadata.owner = job.owner
    msg.spec.terminating = job.terminating
    st = msg.status
    st.stage, st.schedule_state = job.stage.value, job.schedule_state.value
    running = sum(
        1 for p in job.pods.values() if p.role == Role.WORKER and p.state == PodState.RUNNING
    )
    st.reason, st.message = job.reason, live_message(job, running)
    st.leader_restarts = job.leader_restarts
    st.worker_set_restarts.update(job.set_restarts)
    st.leader_retries = job.retries.get("", 0)
    st.worker_set_retries.update({k: v for k, v in job.retries.items() if k})
    _timestamp(job.submit_time, st.submit_time)
    _timestamp(job.start_time, st.start_time)
    _timestamp(job.finish_time, st.finish_time)
    _timestamp(job.checkpoint_time, st.checkpoint_time)
    st.leader_address = job.leader_address
    pods = list(job.pods.values())
    _pod_to_proto(pods[0], st.leader, host)
    for pod in pods[1:]:
        _pod_to_proto(pod, st.workers.add(), host)
    st.running_workers = running
    st.outcome = outcome_of(job.stage.value, job.reason)
    return msg


RUNNING_REASON = "Running"  # the reason of the transition to Running, whose message counts workers


def live_message(job: JobRecord, running_workers: int) -> str:
    """live_message: the job's message as it stands when it is shown. The message stored with
    the transition to Running counted the workers running at that moment; it is built again
    here from `running_workers` (the count shown beside it), so the two never disagree. The
    pods found Stalled (see stalls) are named after it while the job runs."""
    message = job.message
    if job.stage == Stage.RUNNING and job.reason == RUNNING_REASON:
        message = f"leader and {running_workers} of {job.spec.num_workers} workers running"
    if job.active:
        stuck: list[str] = []
        idle: list[str] = []
        for pod in job.pods.values():  # one walk for both marks
            if stalls.stalled(pod):
                stuck.append(pod.name)
            if pod.gpu_idle_since is not None:
                idle.append(pod.name)
        if stuck:
            message += f"; stalled: {_some(stuck)}"
        if idle:
            message += f"; GPUs idle: {_some(idle)}"
    return message


def _some(names: list[str]) -> str:
    """_some: the first three names, and how many more."""
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more


MESSAGE_CHARS = 1024  # a summary's message is cut to this; the job's own status has it whole


def job_summary(job: JobRecord) -> job_pb2.JobSummary:
    """job_summary: the job as listings and watches show it. It holds nothing that `redact`
    hides (no environment, command, arguments or volumes), so every caller gets the same, and
    its size is bounded whatever the spec holds."""
    spec = job.spec
    msg = job_pb2.JobSummary(
        name=spec.name,
        id=job.id,
        owner=job.owner,
        queue=spec.queue,
        priority=spec.priority,
        pods=len(job.pods),
        workers=len(job.pods) - 1,
        experiment=experiment_of(spec),
        idle_gpu_pods=idle_gpu_pods(job),
    )
    cpu_milli = memory = gpu_milli = 0
    for template, count in [(spec.leader, 1), *((w.template, w.counts) for w in spec.worker_sets)]:
        res = template.resources
        cpu_milli += res.cpu_milli * count
        memory += res.memory_bytes * count
        gpu_milli += res.gpu_milli * count
    msg.requested.cpu, msg.requested.memory = cpu_milli / 1000, memory
    msg.requested.gpu = gpu_milli / 1000
    _timestamp(job.submit_time, msg.submit_time)
    job_progress(job, msg.progress)
    return msg


def idle_gpu_pods(job: JobRecord) -> int:
    """idle_gpu_pods: the running job's pods marked with idle GPUs (see idle_gpus); a job that
    ended has none (no walk over its pods)."""
    if not job.active:
        return 0
    return sum(1 for pod in job.pods.values() if pod.gpu_idle_since is not None)


def job_progress(job: JobRecord, out: job_pb2.JobProgress | None = None) -> job_pb2.JobProgress:
    """job_progress: the part of the job that moves as it runs (into `out`, when given)."""
    msg = job_pb2.JobProgress() if out is None else out
    msg.stage, msg.schedule_state = job.stage.value, job.schedule_state.value
    msg.reason = job.reason
    msg.running_workers = sum(
        1 for p in job.pods.values() if p.role == Role.WORKER and p.state == PodState.RUNNING
    )
    message = live_message(job, msg.running_workers)
    msg.message = message if len(message) <= MESSAGE_CHARS else message[: MESSAGE_CHARS - 1] + "…"
    msg.restarts = job.leader_restarts + sum(job.set_restarts.values())
    _timestamp(job.start_time, msg.start_time)
    _timestamp(job.finish_time, msg.finish_time)
    msg.leader_address = job.leader_address
    msg.outcome = outcome_of(job.stage.value, job.reason)
    return msg


def pod_status(pod: PodRecord, host: Host = lambda node: "") -> job_pb2.PodStatus:
    """pod_status: one pod as a job's status shows it (nothing in it is redacted); `host`
    gives a node's address."""
    msg = job_pb2.PodStatus()
    _pod_to_proto(pod, msg, host)
    return msg


Host = Callable[[str], str]  # a node's address, by its name ("": not known)


def _pod_to_proto(pod: PodRecord, out: job_pb2.PodStatus, host: Host) -> None:
    out.name, out.role, out.worker_set = pod.name, pod.role.value, pod.worker_set
    out.index, out.rank, out.node = pod.index, pod.rank, pod.node
    out.address = host(pod.node) if pod.node else ""
    out.stopping = pod.stopping
    out.stalled = stalls.stalled(pod)
    _timestamp(pod.gpu_idle_since, out.gpu_idle_since)
    _timestamp(pod.evict_at, out.evict_at)
    for share in pod.gpus:
        out.gpus.add(index=share.index, share=share.milli / 1000)
    out.state, out.attempt, out.reason, out.pid = pod.state.value, pod.attempt, pod.reason, pod.pid
    if pod.exit_code is not None:
        out.exit_code = pod.exit_code
    out.ports.update(pod.ports)
    _timestamp(pod.start_time, out.start_time)
    _timestamp(pod.finish_time, out.finish_time)


def history_to_proto(record: HistoryRecord) -> arranger_pb2.HistoryRecord:
    """history_to_proto: a history record as ListHistory sends it (the same to every user)."""
    r = record
    msg = arranger_pb2.HistoryRecord(
        id=r.job_id,
        name=r.name,
        owner=r.owner,
        queue=r.queue,
        priority=r.priority,
        waited_seconds=r.waited_s,
        ran_seconds=r.ran_s,
        stage=r.stage,
        reason=r.reason,
        message=r.message,
        stopped_by=r.stopped_by,
        nodes=list(r.nodes),
        pods=r.pods,
        restarts=r.restarts,
        cpu_core_hours=r.cpu_core_hours,
        gpu_hours=r.gpu_hours,
        memory_gib_hours=r.memory_gib_hours,
        outcome=r.outcome,
        experiment=r.experiment,
    )
    for exit in r.pod_exits:
        msg.pod_exits.append(
            arranger_pb2.PodExit(pod=exit.pod, exit_code=exit.exit_code, signal=exit.signal)
        )
    _timestamp(r.submit_time, msg.submit_time)
    _timestamp(r.start_time, msg.start_time)
    _timestamp(r.end_time, msg.end_time)
    if r.leader_exit is not None:
        msg.leader_exit_code = r.leader_exit
    for code, pods in r.worker_exits:
        msg.worker_exit_codes.append(arranger_pb2.ExitCount(exit_code=code, pods=pods))
    for name in (
        "avg_cpu_cores",
        "peak_cpu_cores",
        "peak_memory_bytes",
        "avg_gpu_utilization",
        "peak_gpu_memory_bytes",
    ):
        value = getattr(r, name)
        if value is not None:
            setattr(msg, name, value)
    return msg


def event_to_proto(event: EventRecord) -> arranger_pb2.Event:
    msg = arranger_pb2.Event(
        job=event.job_name,
        job_id=event.job_id,
        pod=event.pod,
        kind=event.kind,
        message=event.message,
    )
    _timestamp(event.time, msg.time)
    return msg


# Nodes.


def node_to_proto(
    node: NodeRecord,
    pods: Iterable[PodRecord],
    job_specs: dict[str, JobSpec],
    now: float | None = None,
) -> node_pb2.Node:
    """node_to_proto renders a node with what the pods bound to it hold; `now` (the server's
    clock) says how long a Ready node's agent has been disconnected."""
    msg = node_pb2.Node(
        name=node.name,
        address=node.address,
        state=node.state.value,
        cordoned=node.cordoned,
        agent_version=node.agent_version,
    )
    msg.labels.update(node.labels)
    msg.runtimes.extend(node.runtimes)
    if node.gpu_sharing is not None:
        sharing = node.gpu_sharing
        # Enforced as it holds now: an enforcing agent whose enforcement fails says so.
        msg.gpu_sharing.enforced = node.shares == SHARES_ENFORCED
        msg.gpu_sharing.isolation = sharing.isolation
        msg.gpu_sharing.isolation_detail = sharing.isolation_detail
    msg.capacity.cpu, msg.capacity.memory = node.cpu_milli / 1000, node.memory_bytes
    msg.capacity.gpu = len(node.gpus)
    gpu_used: dict[int, int] = {}
    cpu = memory = count = 0
    for pod in pods:
        spec = job_specs.get(pod.job_id)
        if spec is None:
            continue
        res = spec.template_of(pod.worker_set).resources
        cpu += res.cpu_milli
        memory += res.memory_bytes
        count += 1
        for share in pod.gpus:
            gpu_used[share.index] = gpu_used.get(share.index, 0) + share.milli
    msg.allocated.cpu, msg.allocated.memory = cpu / 1000, memory
    msg.allocated.gpu = sum(gpu_used.values()) / 1000
    msg.pods = count
    msg.usage.cpu_percent, msg.usage.memory_used = node.cpu_percent, node.memory_used_bytes
    _timestamp(node.last_seen or None, msg.last_heartbeat)
    if now is not None and node.state == NodeState.READY and not node.connected:
        msg.disconnected_seconds = max(0.0, now - node.last_seen)
    if node.clock_offset is not None:
        msg.clock_offset_seconds = node.clock_offset
    for gpu in node.gpus:
        msg.gpus.add(
            index=gpu.index,
            uuid=gpu.uuid,
            model=gpu.model,
            memory=gpu.memory_bytes,
            fake=gpu.fake,
            allocated=gpu_used.get(gpu.index, 0) / 1000,
            problem=gpu.problem,
        )
    return msg


def resources_to_proto(res: Res, out: node_pb2.NodeResources) -> None:
    """resources_to_proto: cores, bytes and GPUs, as the API shows them."""
    out.cpu, out.memory, out.gpu = res.cpu_milli / 1000, res.memory_bytes, res.gpu_milli / 1000
