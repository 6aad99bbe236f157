"""validation turns a submitted TYJob message into a JobSpec, or lists what is wrong with it.

Every refusal names the field path as users write it in YAML (`spec.workerSets[0].counts: must
be >= 1`). Nothing here stores anything: a job is stored only once it parses completely.

The job-wide fields are checked here, its parts (worker sets, pod templates) in part_checks,
single fields in spec_checks. Sizes and counts are held to a Bounds (spec_bounds): BOUNDS for
a job submitted now; a spec read back from the store is held to none (`parse_stored_job`), as
the release that stored it held it to its own. Whatever the bounds, the structure holds:
names are lowercase DNS labels; env names beginning ARRANGER_ and CUDA_VISIBLE_DEVICES are set
by Arranger and may not be given; cpu comes in steps of 0.001 cores; gpu is a whole number, or
a fraction of one GPU in steps of 0.001; pids is a whole number >= 0 (0: the node's default).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from google.protobuf import struct_pb2

from arranger.server import part_checks
from arranger.server.spec_bounds import BOUNDS, UNBOUNDED, Bounds
from arranger.server.spec_checks import Checker, short
from arranger.spec import (
    DEFAULT_MIN_WORKERS,
    DEFAULT_PRIORITY,
    DEFAULT_QUEUE,
    DEFAULT_RESTART_LIMIT,
    MAX_DEPENDENCIES,
    MAX_PRIORITY,
    MIN_PRIORITY,
    WHEN,
    Dependency,
    JobSpec,
    Package,
    Sweep,
    Volume,
    WorkerSet,
)
from arranger.states import BasicPolicy, CleanPodPolicy, JobQueuePolicy
from arranger.sweep import RESERVED, member_name
from arranger.v1 import job_pb2

MAX_DEPENDENCY_NAME = 100  # a job's name or id, as dependsOn names it
MAX_PARAMETERS = 16  # a sweep's parameters
MAX_VALUE_CHARS = 256  # a sweep value, as text
_PARAMETER = re.compile(r"[a-z][a-z0-9_]{0,31}")
_SHOWN = re.compile(r"[A-Za-z0-9_.-]{1,40}")

API_VERSION = "arranger/v1"
KIND = "TYJob"
MAX_ERRORS = 20

_INDEX = re.compile(r"0|[1-9][0-9]*")  # a worker's index as its pod name spells it
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class SpecInvalid(ValueError):
    """SpecInvalid carries every problem found, each as `field.path: what is wrong`; its message
    lists the first MAX_ERRORS of them, one a line."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        shown = errors[:MAX_ERRORS]
        if len(errors) > len(shown):
            shown.append(f"and {len(errors) - len(shown)} more problems")
        super().__init__("\n".join(shown))  # one problem a line


def parse_stored_job(msg: job_pb2.TYJob) -> JobSpec:
    """parse_stored_job reads back a spec as stored (it was checked when submitted): its
    structure is checked as parse_job's, its sizes and counts against no bounds, so a job
    stored before a release lowered one still loads."""
    return parse_job(msg, UNBOUNDED)


def parse_job(msg: job_pb2.TYJob, bounds: Bounds = BOUNDS) -> JobSpec:
    """parse_job returns the JobSpec of a submitted message, or raises SpecInvalid listing every
    problem; its sizes and counts are held to `bounds`. Status, id and other server-owned fields
    of the message are ignored."""
    check = Checker(bounds)
    if msg.api_version not in ("", API_VERSION):
        check.fail("apiVersion", f"{short(msg.api_version)} is not {API_VERSION}")
    if msg.kind not in ("", KIND):
        check.fail("kind", f"{short(msg.kind)} is not {KIND}")
    if not msg.HasField("metadata"):
        check.fail("metadata", "is required")
    meta = msg.metadata
    name = check.name("metadata.name", meta.name, bounds.job_name)
    queue = (
        check.name("metadata.queue", meta.queue, bounds.queue_name, required=False) or DEFAULT_QUEUE
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
        bounds.restart_limit,
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
    if not (math.isfinite(notice) and 0 <= notice <= bounds.timeout_s):
        check.fail("spec.evictionNoticeSeconds", f"must be between 0 and {bounds.timeout_s}")
    if spec.terminating:
        check.fail("spec.terminating", "must be false on submit; use `arranger stop` to end a job")
    volumes = _volumes(check, spec.volumes)
    package = _package(check, spec)
    depends_on = _dependencies(check, spec.depends_on)
    sweep = _sweep(check, spec, name, bounds) if spec.HasField("sweep") else None

    if not spec.HasField("leader"):
        check.fail("spec.leader", "is required")
    leader_name = check.name("spec.leader.name", spec.leader.name, bounds.part_name)
    leader = part_checks.template(check, "spec.leader.template", spec.leader, leader=True)
    leader_codes = part_checks.retry_codes(
        check, "spec.leader.retryOnExitCodes", spec.leader.retry_on_exit_codes
    )
    leader_stall = part_checks.stall_policy(check, "spec.leader", spec.leader)

    gang = basic == BasicPolicy.GANG.value
    worker_sets = part_checks.worker_sets(check, spec.worker_sets, leader_name, gang)
    total = sum(ws.counts for ws in worker_sets if not ws.auxiliary)  # minWorkersNum counts
    most = sum(ws.most for ws in worker_sets)
    if most + 1 > bounds.pods:
        check.fail(
            "spec.workerSets",
            f"the job may have {most + 1} pods (maxCounts); at most {bounds.pods} are allowed",
        )
    min_workers = (
        spec.min_workers_num
        if spec.HasField("min_workers_num")
        else min(DEFAULT_MIN_WORKERS, total)
    )
    if not worker_sets and min_workers > 0:
        check.fail("spec.minWorkersNum", "must be 0 for a job without worker sets")
    elif not 0 <= min_workers <= total:
        check.fail(
            "spec.minWorkersNum",
            f"must be between 0 and the total of counts ({total}; auxiliary sets not counted)",
        )
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
        depends_on=depends_on,
        sweep=sweep,
        leader_retry_on_exit_codes=leader_codes,
        leader_stall=leader_stall,
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


def _dependencies(check: Checker, given: Iterable[job_pb2.Dependency]) -> tuple[Dependency, ...]:
    """_dependencies: the jobs waited for, at most MAX_DEPENDENCIES, each named (its name or
    id, resolved at admission) with a `when` of WHEN (default succeeded)."""
    found: list[Dependency] = []
    for i, dep in enumerate(given):
        field = f"spec.dependsOn[{i}]"
        if i == MAX_DEPENDENCIES:
            check.fail("spec.dependsOn", f"at most {MAX_DEPENDENCIES} jobs")
            break
        if not dep.job or len(dep.job) > MAX_DEPENDENCY_NAME:
            check.fail(f"{field}.job", f"give a job's name or id (1..{MAX_DEPENDENCY_NAME} chars)")
            continue
        when = dep.when or WHEN[0]
        if when not in WHEN:
            check.fail(f"{field}.when", f"{short(dep.when)} is not one of {', '.join(WHEN)}")
            continue
        found.append(Dependency(dep.job, when))
    return tuple(found)


def _sweep(check: Checker, spec: job_pb2.JobSpec, name: str, bounds: Bounds) -> Sweep | None:
    """_sweep: the sweep of an experiment's spec: at most MAX_PARAMETERS parameters named
    [a-z][a-z0-9_]* (not seed or index), each with 1 or more distinct values (text, numbers,
    booleans), seeds 1.., maxParallel 0.. (0: no limit); at most bounds.pods members, whose
    names (NAME-INDEX) are job names within bounds."""
    given = spec.sweep
    parameters: list[tuple[str, tuple[str, ...]]] = []
    for key in sorted(given.parameters) if len(given.parameters) <= MAX_PARAMETERS else []:
        shown = key if _SHOWN.fullmatch(key) else short(key)  # a name safe to echo as it is
        field = f"spec.sweep.parameters.{shown}"
        if not _PARAMETER.fullmatch(key) or key in RESERVED:
            check.fail(field, "a name is [a-z][a-z0-9_]*, at most 32 characters, not seed or index")
            continue
        values = [_sweep_value(v) for v in given.parameters[key].values]
        if not values or None in values or len(set(values)) != len(values):
            check.fail(
                field,
                "give distinct values, each text, a number or a boolean of at most "
                f"{MAX_VALUE_CHARS} characters",
            )
            continue
        parameters.append((key, tuple(v for v in values if v is not None)))
    if len(given.parameters) > MAX_PARAMETERS:
        check.fail("spec.sweep.parameters", f"at most {MAX_PARAMETERS} parameters")
    seeds = given.seeds if given.HasField("seeds") else 1
    if not 1 <= seeds <= bounds.pods:
        check.fail("spec.sweep.seeds", f"must be between 1 and {bounds.pods}")
    parallel = given.max_parallel if given.HasField("max_parallel") else 0
    if not 0 <= parallel <= bounds.pods:
        check.fail("spec.sweep.maxParallel", f"must be between 0 (no limit) and {bounds.pods}")
    member = given.member if given.HasField("member") else None
    if member is not None and bounds is not UNBOUNDED:
        check.fail("spec.sweep.member", "is set by the server on an experiment's members")
    if check.errors:
        return None
    sweep = Sweep(tuple(parameters), seeds, parallel, member, given.seed)
    if member is not None:
        return sweep
    if sweep.size > bounds.pods:
        check.fail(
            "spec.sweep",
            f"makes {sweep.size} members ({sweep.points} points x {seeds} seeds); at most "
            f"{bounds.pods}",
        )
    elif name and len(member_name(name, sweep.size - 1)) > bounds.job_name:
        check.fail(
            "metadata.name",
            f"members are named {name}-0..{member_name(name, sweep.size - 1)}: at most "
            f"{bounds.job_name} characters",
        )
    return sweep


def _sweep_value(value: struct_pb2.Value) -> str | None:
    """_sweep_value: a sweep value as pods see it (a whole number without a point, booleans
    as true/false), or None for one that is no scalar or is too long."""
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        text = value.string_value
    elif kind == "bool_value":
        text = "true" if value.bool_value else "false"
    elif kind == "number_value" and math.isfinite(value.number_value):
        number = value.number_value
        text = str(int(number)) if number.is_integer() and abs(number) < 2**53 else repr(number)
    else:
        return None
    return text if 0 < len(text) <= MAX_VALUE_CHARS and "\0" not in text else None


def _package(check: Checker, spec: job_pb2.JobSpec) -> Package | None:
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


def _volumes(check: Checker, volumes: Iterable[job_pb2.Volume]) -> tuple[Volume, ...]:
    result: list[Volume] = []
    seen: set[str] = set()
    for i, vol in enumerate(volumes):
        path = f"spec.volumes[{i}]"
        if i >= check.bounds.volumes:
            check.fail("spec.volumes", f"must have at most {check.bounds.volumes} entries")
            break
        check.name(f"{path}.name", vol.name, check.bounds.part_name)
        if vol.name in seen:
            check.fail(f"{path}.name", f"{short(vol.name)} is declared twice")
        seen.add(vol.name)
        check.absolute_path(f"{path}.hostPath", vol.host_path, required=True)
        check.absolute_path(f"{path}.mountPath", vol.mount_path, required=False)
        if any(c in vol.mount_path for c in ":,"):  # podman's --volume separators
            check.fail(f"{path}.mountPath", "must not contain ':' or ','")
        result.append(
            Volume(vol.name, vol.host_path, vol.mount_path or vol.host_path, vol.read_only)
        )
    return tuple(result)
