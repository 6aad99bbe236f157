"""part_checks: the checks of a job's parts: its worker sets, and the pod template of the
leader and of each set (command, env, ports, resources).

Every problem is added to the Checker (arranger.server.spec_checks), named by its field path;
sizes and counts are held to the Checker's bounds.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence

from arranger.quantity import format_memory
from arranger.server.spec_checks import Checker, short
from arranger.spec import (
    DEFAULT_CPU_MILLI,
    DEFAULT_MEMORY_BYTES,
    LEADER_DEFAULT_PORT,
    ON_STALL,
    START_AFTER,
    PodTemplate,
    Resources,
    StallPolicy,
    WorkerSet,
    image_problem,
)
from arranger.v1 import job_pb2

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PORT_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,13}[a-z0-9])?$")
_GPU_TYPE = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_. ]{0,62}$")
_RESERVED_ENV = ("ARRANGER_",)
_RESERVED_ENV_NAMES = frozenset({"CUDA_VISIBLE_DEVICES"})


def worker_sets(
    check: Checker, sets: Iterable[job_pb2.WorkerSet], leader_name: str, gang: bool
) -> tuple[WorkerSet, ...]:
    """worker_sets: the job's sets, each named apart from the others and the leader, with
    0 <= minCount <= counts <= maxCounts (a Gang job's: counts == maxCounts)."""
    bounds = check.bounds
    result: list[WorkerSet] = []
    seen: set[str] = {leader_name}
    for i, ws in enumerate(sets):
        path = f"spec.workerSets[{i}]"
        if i >= bounds.worker_sets:
            check.fail("spec.workerSets", f"must have at most {bounds.worker_sets} entries")
            break
        check.name(f"{path}.name", ws.name, bounds.part_name)
        if ws.name and ws.name in seen:
            what = "the leader's name" if ws.name == leader_name else "declared twice"
            check.fail(f"{path}.name", f"{short(ws.name)} is {what}; names must be unique")
        seen.add(ws.name)
        counts = ws.counts if ws.HasField("counts") else 1
        most = ws.max_counts if ws.HasField("max_counts") else max(counts, 1)
        if not 1 <= most <= bounds.pods:
            check.fail(f"{path}.maxCounts", f"must be between 1 and {bounds.pods}")
        if not ws.HasField("max_counts") and counts < 1:
            check.fail(f"{path}.counts", "must be >= 1 (0 only for a set with maxCounts)")
        elif not 0 <= counts <= min(most, bounds.pods):
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
        pods = template(check, f"{path}.template", ws, leader=False)
        codes = retry_codes(check, f"{path}.retryOnExitCodes", ws.retry_on_exit_codes)
        stall = stall_policy(check, path, ws)
        delay, start_after = _helper_role(check, path, ws, min_count)
        result.append(
            WorkerSet(
                ws.name,
                max(counts, 0),
                pods,
                max(min_count, 0),
                max(most, 1),
                codes,
                stall,
                ws.auxiliary,
                delay,
                start_after,
            )
        )
    return tuple(result)


MAX_RETRY_CODES = 32


def _helper_role(
    check: Checker, path: str, ws: job_pb2.WorkerSet, min_count: int
) -> tuple[float, str]:
    """_helper_role: an auxiliary set's terminationDelaySeconds (0 and up, within the bounds'
    timeouts; only for an auxiliary set, which has no minCount) and any set's startAfter."""
    delay = 0.0
    if ws.HasField("termination_delay_seconds"):
        delay = ws.termination_delay_seconds
        most = check.bounds.timeout_s
        if not (math.isfinite(delay) and 0 <= delay <= most):
            check.fail(f"{path}.terminationDelaySeconds", f"must be between 0 and {most}")
            delay = 0.0
        elif not ws.auxiliary:
            check.fail(f"{path}.terminationDelaySeconds", "is for an auxiliary set only")
    if ws.auxiliary and min_count > 0:
        check.fail(f"{path}.minCount", "an auxiliary set is never in the gang minimum: drop it")
    if ws.start_after not in START_AFTER:
        check.fail(f"{path}.startAfter", f"{short(ws.start_after)} is not leaderReady")
    return delay, ws.start_after if ws.start_after in START_AFTER else ""


def stall_policy(
    check: Checker, path: str, owner: job_pb2.Leader | job_pb2.WorkerSet
) -> StallPolicy:
    """stall_policy: progressTimeoutSeconds (above 0, within the bounds' timeouts) and onStall
    (notify, restart or fail; notify by default, and only with a timeout)."""
    timeout = check.seconds(owner, "progress_timeout_seconds", f"{path}.progressTimeoutSeconds")
    on_stall = owner.on_stall or "notify"
    if on_stall not in ON_STALL:
        check.fail(f"{path}.onStall", f"{short(on_stall)} is not one of {', '.join(ON_STALL)}")
        on_stall = "notify"
    elif owner.on_stall and timeout is None:
        check.fail(f"{path}.onStall", "needs progressTimeoutSeconds")
    return StallPolicy(timeout, on_stall)


def retry_codes(check: Checker, path: str, codes: Sequence[int]) -> tuple[int, ...]:
    """retry_codes: retryOnExitCodes, sorted: each an exit status a process can end with
    other than success (1..255; a signal's death reads 128 + its number), at most
    MAX_RETRY_CODES of them."""
    if len(codes) > MAX_RETRY_CODES:
        check.fail(path, f"must have at most {MAX_RETRY_CODES} entries")
        return ()
    bad = [code for code in codes if not 1 <= code <= 255]
    if bad:
        check.fail(path, f"{bad[0]} is not an exit code that means failure (1..255)")
        return ()
    return tuple(sorted(set(codes)))


def template(
    check: Checker, path: str, owner: job_pb2.Leader | job_pb2.WorkerSet, leader: bool
) -> PodTemplate:
    """template: the pod template of the leader or of a worker set (the leader's has a port,
    `rpc`, when it declares none)."""
    bounds = check.bounds
    if not owner.HasField("template"):
        check.fail(path, "is required")
    tpl = owner.template
    argv = [*tpl.command, *tpl.args]
    if not tpl.command:
        check.fail(f"{path}.command", "is required: the program and its arguments")
    elif not tpl.command[0]:
        check.fail(f"{path}.command[0]", "must not be empty")
    if len(argv) > bounds.argv_entries:
        most = bounds.argv_entries
        check.fail(f"{path}.args", f"command and args must have at most {most} entries")
    elif sum(len(a.encode()) + 1 for a in argv) > bounds.argv_bytes:
        most = bounds.argv_bytes
        check.fail(f"{path}.args", f"command and args must be at most {most} bytes")
    elif any("\x00" in a for a in argv):
        check.fail(f"{path}.command", "must not contain NUL characters")
    _env(check, f"{path}.env", tpl.env)
    check.text(f"{path}.workingDir", tpl.working_dir, bounds.path)
    selector = check.labels(f"{path}.nodeSelector", tpl.node_selector)
    ports = _ports(check, f"{path}.ports", tpl.ports)
    if leader and not ports:
        ports = (LEADER_DEFAULT_PORT,)
    readiness = tpl.readiness.port
    if readiness and readiness not in ports:
        check.fail(f"{path}.readiness.port", f"{short(readiness)} is not one of the declared ports")
    problem = image_problem(tpl.image) if tpl.image else None
    if problem:
        check.fail(f"{path}.image", f"{short(tpl.image)} {problem}")
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


def _env(check: Checker, path: str, env: Mapping[str, str]) -> None:
    bounds = check.bounds
    if len(env) > bounds.env_entries:
        check.fail(path, f"must have at most {bounds.env_entries} variables")
        return
    size = 0
    for key, value in env.items():
        size += len(key.encode()) + len(value.encode()) + 2
        if not _ENV_NAME.fullmatch(key) or len(key) > bounds.env_name:
            check.fail(
                f"{path}[{short(key)}]",
                "names must be letters, digits and '_', not starting with a digit",
            )
        elif key.startswith(_RESERVED_ENV) or key in _RESERVED_ENV_NAMES:
            check.fail(f"{path}[{short(key)}]", "is set by Arranger and may not be given")
        if "\x00" in value:
            check.fail(f"{path}[{short(key)}]", "must not contain NUL characters")
    if size > bounds.env_bytes:
        check.fail(path, f"is {size} bytes; at most {bounds.env_bytes} are allowed")


def _ports(check: Checker, path: str, ports: Iterable[job_pb2.Port]) -> tuple[str, ...]:
    names: list[str] = []
    for i, port in enumerate(ports):
        if i >= check.bounds.ports:
            check.fail(path, f"must have at most {check.bounds.ports} entries")
            break
        if not _PORT_NAME.fullmatch(port.name):
            check.fail(
                f"{path}[{i}].name",
                f"{short(port.name)} must be 1-15 lowercase letters, "
                "digits and '-', starting with a letter",
            )
        elif port.name in names:
            check.fail(f"{path}[{i}].name", f"{short(port.name)} is declared twice")
        names.append(port.name)
    return tuple(names)


def _resources(check: Checker, path: str, res: job_pb2.Resources) -> Resources:
    bounds = check.bounds
    cpu_milli = DEFAULT_CPU_MILLI
    if res.HasField("cpu"):
        if not math.isfinite(res.cpu) or not 0 <= res.cpu <= bounds.cpu_cores:
            check.fail(f"{path}.cpu", f"must be between 0 and {bounds.cpu_cores} cores")
        else:
            cpu_milli = round(res.cpu * 1000)
            if abs(cpu_milli - res.cpu * 1000) > 1e-6:
                check.fail(f"{path}.cpu", "must be a multiple of 0.001 cores (1m)")
    memory = DEFAULT_MEMORY_BYTES
    if res.HasField("memory"):
        memory = res.memory
        if not 0 <= memory <= bounds.memory_bytes:
            most = format_memory(bounds.memory_bytes)
            check.fail(f"{path}.memory", f"must be between 0 and {most} bytes")
    gpu_milli = 0
    if not math.isfinite(res.gpu) or not 0 <= res.gpu <= bounds.gpus:
        check.fail(f"{path}.gpu", f"must be between 0 and {bounds.gpus}")
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
                f"{path}.{field}", f"{short(value)} is not a GPU model name (or several, A|B)"
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
