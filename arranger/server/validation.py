"""validation turns a submitted TYJob message into a JobSpec, or lists what is wrong with it.

Every refusal names the field path as users write it in YAML (`spec.workerSets[0].counts: must
be >= 1`). Nothing here stores anything: a job is stored only once it parses completely.

Limits (documented in README "Limits"):
- job name: 1-48 characters, lowercase DNS label (`[a-z0-9]([-a-z0-9]*[a-z0-9])?`); leader and
  worker set names: the same form, 1-24 characters; queue names: 1-63.
- at most 64 worker sets, 10,000 pods per job, 16 ports and 32 volumes per template/job.
- command plus args: at most 1,024 entries and 128 KiB; env: at most 1,024 variables and 64 KiB;
  names beginning ARRANGER_ and CUDA_VISIBLE_DEVICES are set by Arranger and may not be given.
- labels and nodeSelector: at most 64 entries, keys up to 63 characters, values up to 63.
- cpu 0..10,000 cores in steps of 0.001; memory 0..1 PiB; gpu 0..64, whole numbers, or a
  fraction of one GPU in steps of 0.001; scheduleTimeoutSeconds up to 10^7.
- pids: a whole number >= 0 (0: the node's default); the server's `limits.pidsPerPod` caps it
  at submit (limits.UserLimits.above_maxima), not here, so a spec stored before a lower cap
  still loads.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

from arranger.spec import (
    DEFAULT_CPU_MILLI,
    DEFAULT_MEMORY_BYTES,
    DEFAULT_MIN_WORKERS,
    DEFAULT_PRIORITY,
    DEFAULT_QUEUE,
    DEFAULT_RESTART_LIMIT,
    LEADER_DEFAULT_PORT,
    MAX_PRIORITY,
    MIN_PRIORITY,
    JobSpec,
    Package,
    PodTemplate,
    Resources,
    Volume,
    WorkerSet,
    image_problem,
)
from arranger.states import BasicPolicy, CleanPodPolicy, JobQueuePolicy
from arranger.v1 import job_pb2

API_VERSION = "arranger/v1"
KIND = "TYJob"
MAX_JOB_NAME = 48
MAX_PART_NAME = 24
MAX_QUEUE_NAME = 63
MAX_WORKER_SETS = 64
MAX_PODS = 10_000
MAX_RESTART_LIMIT = 1_000
MAX_PORTS = 16
MAX_VOLUMES = 32
MAX_ARGV_ENTRIES = 1_024
MAX_ARGV_BYTES = 128 * 1024
MAX_ENV_ENTRIES = 1_024
MAX_ENV_BYTES = 64 * 1024
MAX_MAP_ENTRIES = 64
MAX_LABEL = 63
MAX_PATH = 4_096
MAX_CPU_CORES = 10_000
MAX_MEMORY_BYTES = 2**50
MAX_GPUS = 64
MAX_ERRORS = 20
MAX_TIMEOUT_S = 10**7

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_KEY = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PORT_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,13}[a-z0-9])?$")
_GPU_TYPE = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_. ]{0,62}$")
_INDEX = re.compile(r"0|[1-9][0-9]*")  # a worker's index as its pod name spells it
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_RESERVED_ENV = ("ARRANGER_",)
_RESERVED_ENV_NAMES = frozenset({"CUDA_VISIBLE_DEVICES"})


class SpecInvalid(ValueError):
    """SpecInvalid carries every problem found, each as `field.path: what is wrong`; its message
    lists the first MAX_ERRORS of them, one a line."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        shown = errors[:MAX_ERRORS]
        if len(errors) > len(shown):
            shown.append(f"and {len(errors) - len(shown)} more problems")
        super().__init__("\n".join(shown))  # one problem a line


class _Checker:
    """_Checker collects errors while a message is converted, so one reply lists them all."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def fail(self, path: str, what: str) -> None:
        self.errors.append(f"{path}: {what}")

    def name(self, path: str, value: str, limit: int, required: bool = True) -> str:
        if not value:
            if required:
                self.fail(path, "is required")
            return value
        if len(value) > limit:
            self.fail(path, f"must be at most {limit} characters")
        elif not _DNS_LABEL.fullmatch(value):
            self.fail(
                path,
                f"{_short(value)} must be lowercase letters, digits and '-', "
                "starting and ending with a letter or digit",
            )
        return value

    def text(self, path: str, value: str, limit: int) -> str:
        if len(value) > limit:
            self.fail(path, f"must be at most {limit} characters")
        elif "\x00" in value:
            self.fail(path, "must not contain NUL characters")
        return value

    def labels(self, path: str, labels: Mapping[str, str]) -> dict[str, str]:
        if len(labels) > MAX_MAP_ENTRIES:
            self.fail(path, f"must have at most {MAX_MAP_ENTRIES} entries")
            return {}
        for key, value in labels.items():
            if len(key) > MAX_LABEL or not _LABEL_KEY.fullmatch(key):
                self.fail(
                    f"{path}[{_short(key)}]", "key must be 1-63 letters, digits, '-', '_', '.', '/'"
                )
            if len(value) > MAX_LABEL or not _LABEL_VALUE.fullmatch(value):
                self.fail(
                    f"{path}[{_short(key)}]",
                    "value must be at most 63 letters, digits, '-', '_', '.'",
                )
        return dict(labels)

    def choice(
        self,
        path: str,
        value: str,
        enum: type[CleanPodPolicy] | type[JobQueuePolicy] | type[BasicPolicy],
        default: str,
    ) -> str:
        if not value:
            return default
        allowed = [member.value for member in enum]
        if value not in allowed:
            self.fail(path, f"{_short(value)} is not one of {', '.join(allowed)}")
            return default
        return value

    def seconds(self, spec: job_pb2.JobSpec, field: str, path: str) -> float | None:
        """seconds reads an optional duration: above 0, at most MAX_TIMEOUT_S."""
        if not spec.HasField(field):  # type: ignore[arg-type]
            return None
        value = float(getattr(spec, field))
        if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S):
            self.fail(path, f"must be above 0 and at most {MAX_TIMEOUT_S}")
        return value

    def bounded(self, path: str, value: int, low: int, high: int) -> int:
        if not low <= value <= high:
            self.fail(path, f"must be between {low} and {high}")
        return value


def _short(value: str, limit: int = 40) -> str:
    shown = value if len(value) <= limit else value[:limit] + "..."
    return repr(shown)


def parse_job(msg: job_pb2.TYJob) -> JobSpec:
    """parse_job returns the JobSpec of a submitted message, or raises SpecInvalid listing every
    problem. Status, id and other server-owned fields of the message are ignored."""
    check = _Checker()
    if msg.api_version not in ("", API_VERSION):
        check.fail("apiVersion", f"{_short(msg.api_version)} is not {API_VERSION}")
    if msg.kind not in ("", KIND):
        check.fail("kind", f"{_short(msg.kind)} is not {KIND}")
    if not msg.HasField("metadata"):
        check.fail("metadata", "is required")
    meta = msg.metadata
    name = check.name("metadata.name", meta.name, MAX_JOB_NAME)
    queue = (
        check.name("metadata.queue", meta.queue, MAX_QUEUE_NAME, required=False) or DEFAULT_QUEUE
    )
    labels = check.labels("metadata.labels", meta.labels)
    if not msg.HasField("spec"):
        check.fail("spec", "is required")
        raise SpecInvalid(check.errors)
    spec = msg.spec

    priority = check.bounded(
        "spec.priority",
        spec.priority if spec.HasField("priority") else DEFAULT_PRIORITY,
        MIN_PRIORITY,
        MAX_PRIORITY,
    )
    restart_limit = check.bounded(
        "spec.restartLimit",
        spec.restart_limit if spec.HasField("restart_limit") else DEFAULT_RESTART_LIMIT,
        0,
        MAX_RESTART_LIMIT,
    )
    clean = check.choice("spec.cleanPodPolicy", spec.clean_pod_policy, CleanPodPolicy, "All")
    queue_policy = check.choice(
        "spec.schedulerPolicy.jobQueuePolicy",
        spec.scheduler_policy.job_queue_policy,
        JobQueuePolicy,
        "Priority",
    )
    basic = check.choice(
        "spec.schedulerPolicy.basicPolicy",
        spec.scheduler_policy.basic_policy,
        BasicPolicy,
        "BinPack",
    )
    timeout = check.seconds(spec, "schedule_timeout_seconds", "spec.scheduleTimeoutSeconds")
    grace = check.seconds(spec, "preemption_grace_seconds", "spec.preemptionGraceSeconds")
    max_runtime = check.seconds(spec, "max_runtime_seconds", "spec.maxRuntimeSeconds")
    notice = spec.eviction_notice_seconds
    if not (math.isfinite(notice) and 0 <= notice <= MAX_TIMEOUT_S):
        check.fail("spec.evictionNoticeSeconds", f"must be between 0 and {MAX_TIMEOUT_S}")
    if spec.terminating:
        check.fail("spec.terminating", "must be false on submit; use `arranger stop` to end a job")
    volumes = _volumes(check, spec.volumes)
    package = _package(check, spec)

    if not spec.HasField("leader"):
        check.fail("spec.leader", "is required")
    leader_name = check.name("spec.leader.name", spec.leader.name, MAX_PART_NAME)
    leader = _template(check, "spec.leader.template", spec.leader, leader=True)

    gang = basic == BasicPolicy.GANG.value
    worker_sets = _worker_sets(check, spec.worker_sets, leader_name, gang)
    total = sum(ws.counts for ws in worker_sets)
    most = sum(ws.most for ws in worker_sets)
    if most + 1 > MAX_PODS:
        check.fail(
            "spec.workerSets",
            f"the job may have {most + 1} pods (maxCounts); at most {MAX_PODS} are allowed",
        )
    min_workers = (
        spec.min_workers_num
        if spec.HasField("min_workers_num")
        else min(DEFAULT_MIN_WORKERS, total)
    )
    if not worker_sets and min_workers > 0:
        check.fail("spec.minWorkersNum", "must be 0 for a job without worker sets")
    elif not 0 <= min_workers <= total:
        check.fail("spec.minWorkersNum", f"must be between 0 and the total of counts ({total})")
    min_counts = sum(ws.min_count for ws in worker_sets)
    if min_counts > min_workers:
        check.fail(
            "spec.workerSets",
            f"the minCounts add up to {min_counts}, more than minWorkersNum ({min_workers})",
        )

    if check.errors:
        raise SpecInvalid(check.errors)
    parsed = JobSpec(
        name=name,
        queue=queue,
        labels=labels,
        priority=priority,
        restart_limit=restart_limit,
        min_workers_num=min_workers,
        clean_pod_policy=CleanPodPolicy(clean),
        job_queue_policy=JobQueuePolicy(queue_policy),
        basic_policy=BasicPolicy(basic),
        volumes=volumes,
        leader_name=leader_name,
        leader=leader,
        worker_sets=worker_sets,
        schedule_timeout_s=timeout,
        machine_group_only=spec.scheduler_policy.machine_group_only,
        preemptible=spec.preemptible if spec.HasField("preemptible") else True,
        preemption_grace_s=grace,
        max_runtime_s=max_runtime,
        package=package,
        eviction_notice_s=notice if math.isfinite(notice) else 0.0,
    )
    if _names_a_worker(leader_name, worker_sets):
        raise SpecInvalid([f"spec.leader.name: {leader_name!r} is also the name of a worker pod"])
    return parsed


def _names_a_worker(leader_name: str, worker_sets: tuple[WorkerSet, ...]) -> bool:
    """_names_a_worker: the leader's name is `<set>-<index>` of a worker its set has or may
    have once scaled (an index below its maxCounts), whose pod would have the leader's pod's
    name."""
    set_name, _, index = leader_name.rpartition("-")
    ws = next((w for w in worker_sets if w.name == set_name), None)
    return ws is not None and _INDEX.fullmatch(index) is not None and int(index) < ws.most


def _package(check: _Checker, spec: job_pb2.JobSpec) -> Package | None:
    if spec.working_dir:
        check.fail(
            "spec.workingDir",
            "is read by the client, which packs the directory and sends spec.package instead "
            "(arranger submit; the SDK's submit)",
        )
    if not spec.HasField("package"):
        return None
    sha256, size = spec.package.sha256, spec.package.size
    if not _SHA256.fullmatch(sha256):
        check.fail("spec.package.sha256", "must be 64 lowercase hexadecimal digits")
    if size <= 0:
        check.fail("spec.package.size", "must be above 0")
    return Package(sha256, size)


def _volumes(check: _Checker, volumes: Iterable[job_pb2.Volume]) -> tuple[Volume, ...]:
    result: list[Volume] = []
    seen: set[str] = set()
    for i, vol in enumerate(volumes):
        path = f"spec.volumes[{i}]"
        if i >= MAX_VOLUMES:
            check.fail("spec.volumes", f"must have at most {MAX_VOLUMES} entries")
            break
        check.name(f"{path}.name", vol.name, MAX_PART_NAME)
        if vol.name in seen:
            check.fail(f"{path}.name", f"{_short(vol.name)} is declared twice")
        seen.add(vol.name)
        _absolute_path(check, f"{path}.hostPath", vol.host_path, required=True)
        _absolute_path(check, f"{path}.mountPath", vol.mount_path, required=False)
        if any(c in vol.mount_path for c in ":,"):  # podman's --volume separators
            check.fail(f"{path}.mountPath", "must not contain ':' or ','")
        result.append(
            Volume(vol.name, vol.host_path, vol.mount_path or vol.host_path, vol.read_only)
        )
    return tuple(result)


def _absolute_path(check: _Checker, path: str, value: str, required: bool) -> None:
    if not value:
        if required:
            check.fail(path, "is required")
        return
    check.text(path, value, MAX_PATH)
    if not value.startswith("/"):
        check.fail(path, "must be an absolute path")
    elif ".." in value.split("/"):
        check.fail(path, "must not contain '..'")


def _worker_sets(
    check: _Checker, sets: Iterable[job_pb2.WorkerSet], leader_name: str, gang: bool
) -> tuple[WorkerSet, ...]:
    result: list[WorkerSet] = []
    seen: set[str] = {leader_name}
    for i, ws in enumerate(sets):
        path = f"spec.workerSets[{i}]"
        if i >= MAX_WORKER_SETS:
            check.fail("spec.workerSets", f"must have at most {MAX_WORKER_SETS} entries")
            break
        check.name(f"{path}.name", ws.name, MAX_PART_NAME)
        if ws.name and ws.name in seen:
            what = "the leader's name" if ws.name == leader_name else "declared twice"
            check.fail(f"{path}.name", f"{_short(ws.name)} is {what}; names must be unique")
        seen.add(ws.name)
        counts = ws.counts if ws.HasField("counts") else 1
        most = ws.max_counts if ws.HasField("max_counts") else max(counts, 1)
        if not 1 <= most <= MAX_PODS:
            check.fail(f"{path}.maxCounts", f"must be between 1 and {MAX_PODS}")
        if not ws.HasField("max_counts") and counts < 1:
            check.fail(f"{path}.counts", "must be >= 1 (0 only for a set with maxCounts)")
        elif not 0 <= counts <= min(most, MAX_PODS):
            check.fail(f"{path}.counts", f"must be between 0 and maxCounts ({most})")
        min_count = ws.min_count if ws.HasField("min_count") else 0
        if not 0 <= min_count <= max(counts, 0):
            check.fail(f"{path}.minCount", f"must be between 0 and counts ({counts})")
        if gang and most > counts:
            check.fail(
                f"{path}.maxCounts",
                "a Gang job's sets have a fixed size (basicPolicy Gang); drop maxCounts or "
                "use another basicPolicy with minWorkersNum",
            )
        template = _template(check, f"{path}.template", ws, leader=False)
        result.append(WorkerSet(ws.name, max(counts, 0), template, max(min_count, 0), max(most, 1)))
    return tuple(result)


def _template(
    check: _Checker, path: str, owner: job_pb2.Leader | job_pb2.WorkerSet, leader: bool
) -> PodTemplate:
    if not owner.HasField("template"):
        check.fail(path, "is required")
    tpl = owner.template
    argv = [*tpl.command, *tpl.args]
    if not tpl.command:
        check.fail(f"{path}.command", "is required: the program and its arguments")
    elif not tpl.command[0]:
        check.fail(f"{path}.command[0]", "must not be empty")
    if len(argv) > MAX_ARGV_ENTRIES:
        check.fail(f"{path}.args", f"command and args must have at most {MAX_ARGV_ENTRIES} entries")
    elif sum(len(a.encode()) + 1 for a in argv) > MAX_ARGV_BYTES:
        check.fail(f"{path}.args", f"command and args must be at most {MAX_ARGV_BYTES} bytes")
    elif any("\x00" in a for a in argv):
        check.fail(f"{path}.command", "must not contain NUL characters")
    _env(check, f"{path}.env", tpl.env)
    check.text(f"{path}.workingDir", tpl.working_dir, MAX_PATH)
    selector = check.labels(f"{path}.nodeSelector", tpl.node_selector)
    ports = _ports(check, f"{path}.ports", tpl.ports)
    if leader and not ports:
        ports = (LEADER_DEFAULT_PORT,)
    readiness = tpl.readiness.port
    if readiness and readiness not in ports:
        check.fail(
            f"{path}.readiness.port", f"{_short(readiness)} is not one of the declared ports"
        )
    problem = image_problem(tpl.image) if tpl.image else None
    if problem:
        check.fail(f"{path}.image", f"{_short(tpl.image)} {problem}")
    return PodTemplate(
        command=tuple(tpl.command),
        args=tuple(tpl.args),
        env=dict(tpl.env),
        working_dir=tpl.working_dir,
        resources=_resources(check, f"{path}.resources", tpl.resources),
        node_selector=selector,
        ports=ports,
        readiness_port=readiness,
        image=tpl.image,
    )


def _env(check: _Checker, path: str, env: Mapping[str, str]) -> None:
    if len(env) > MAX_ENV_ENTRIES:
        check.fail(path, f"must have at most {MAX_ENV_ENTRIES} variables")
        return
    size = 0
    for key, value in env.items():
        size += len(key.encode()) + len(value.encode()) + 2
        if not _ENV_NAME.fullmatch(key) or len(key) > 256:
            check.fail(
                f"{path}[{_short(key)}]",
                "names must be letters, digits and '_', not starting with a digit",
            )
        elif key.startswith(_RESERVED_ENV) or key in _RESERVED_ENV_NAMES:
            check.fail(f"{path}[{_short(key)}]", "is set by Arranger and may not be given")
        if "\x00" in value:
            check.fail(f"{path}[{_short(key)}]", "must not contain NUL characters")
    if size > MAX_ENV_BYTES:
        check.fail(path, f"is {size} bytes; at most {MAX_ENV_BYTES} are allowed")


def _ports(check: _Checker, path: str, ports: Iterable[job_pb2.Port]) -> tuple[str, ...]:
    names: list[str] = []
    for i, port in enumerate(ports):
        if i >= MAX_PORTS:
            check.fail(path, f"must have at most {MAX_PORTS} entries")
            break
        if not _PORT_NAME.fullmatch(port.name):
            check.fail(
                f"{path}[{i}].name",
                f"{_short(port.name)} must be 1-15 lowercase letters, "
                "digits and '-', starting with a letter",
            )
        elif port.name in names:
            check.fail(f"{path}[{i}].name", f"{_short(port.name)} is declared twice")
        names.append(port.name)
    return tuple(names)


def _resources(check: _Checker, path: str, res: job_pb2.Resources) -> Resources:
    cpu_milli = DEFAULT_CPU_MILLI
    if res.HasField("cpu"):
        if not math.isfinite(res.cpu) or not 0 <= res.cpu <= MAX_CPU_CORES:
            check.fail(f"{path}.cpu", f"must be between 0 and {MAX_CPU_CORES} cores")
        else:
            cpu_milli = round(res.cpu * 1000)
            if abs(cpu_milli - res.cpu * 1000) > 1e-6:
                check.fail(f"{path}.cpu", "must be a multiple of 0.001 cores (1m)")
    memory = DEFAULT_MEMORY_BYTES
    if res.HasField("memory"):
        memory = res.memory
        if not 0 <= memory <= MAX_MEMORY_BYTES:
            check.fail(f"{path}.memory", "must be between 0 and 1Pi bytes")
    gpu_milli = 0
    if not math.isfinite(res.gpu) or not 0 <= res.gpu <= MAX_GPUS:
        check.fail(f"{path}.gpu", f"must be between 0 and {MAX_GPUS}")
    elif res.gpu > 1 and res.gpu != int(res.gpu):
        check.fail(f"{path}.gpu", "above 1 must be a whole number of GPUs")
    else:
        gpu_milli = round(res.gpu * 1000)
        if res.gpu and (gpu_milli == 0 or abs(gpu_milli - res.gpu * 1000) > 1e-6):
            check.fail(f"{path}.gpu", "a fraction of a GPU must be a multiple of 0.001")
    for field, value in (("gpuType", res.gpu_type), ("preferredGpuType", res.preferred_gpu_type)):
        if not value:
            continue
        if not all(_GPU_TYPE.fullmatch(model) for model in value.split("|")):
            check.fail(
                f"{path}.{field}", f"{_short(value)} is not a GPU model name (or several, A|B)"
            )
        elif gpu_milli == 0:
            check.fail(f"{path}.{field}", "is set but gpu is 0")
    if res.pids < 0:
        check.fail(f"{path}.pids", "must be a whole number >= 0 (0: the node's default)")
    return Resources(
        cpu_milli,
        max(memory, 0),
        gpu_milli,
        res.gpu_type,
        res.preferred_gpu_type,
        pids=max(res.pids, 0),
    )
