"""access: what a caller may do and see, and what a job may ask for, by the server's policy.

- A user may stop, delete and change only their own jobs; an admin any. Nodes, queues and
  tokens are for admins.
- Every job stays visible to every caller (stage, queue, resources, owner, reasons), but
  another user's environment values, command arguments, volumes' host paths and package hash
  are redacted, and their logs refused. What agents say of a job's pods (its reasons, and so
  its message, events and history) is scrubbed of those values as it arrives (`redaction`).
- A job must keep to its queue's policy (who may submit, maximum priority, non-preemptible)
  unless an admin submits it; its volumes must lie under `allowedHostPaths`; its environment
  must not set the variables of `deniedEnv` (ones that change how programs load: the agent
  never lets a job's environment reach a root process, and this refuses them before it gets
  there).

Refusals name the field and the rule, as validation's do.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from arranger.identity import Principal
from arranger.server.model import JobRecord
from arranger.server.queues import QueueRecord
from arranger.spec import JobSpec, PodTemplate
from arranger.v1 import job_pb2

DEFAULT_DENIED_ENV = ("LD_PRELOAD", "LD_AUDIT", "GCONV_PATH", "BASH_ENV", "ENV", "IFS")
REDACTED = "(hidden)"


@dataclass(frozen=True)
class SubmitPolicy:
    """SubmitPolicy: the server config's `allowedHostPaths` (prefixes; empty: no host paths)
    and `deniedEnv`."""

    allowed_host_paths: tuple[str, ...] = ()
    denied_env: tuple[str, ...] = DEFAULT_DENIED_ENV

    def problems(self, spec: JobSpec, caller: Principal, queue: QueueRecord) -> list[str]:
        """problems: why this caller may not submit this job to this queue (empty: it may)."""
        found = []
        if not caller.admin:
            problem = queue.policy_problem(caller.user, spec.priority, spec.preemptible)
            if problem:
                found.append(problem)
        for i, volume in enumerate(spec.volumes):
            problem = self._host_path_problem(volume.host_path)
            if problem:
                found.append(f"spec.volumes[{i}].hostPath: {problem}")
        denied = set(self.denied_env)
        for path, template in _templates(spec):
            for name in sorted(denied.intersection(template.env)):
                found.append(f"{path}.env.{name}: may not be set (deniedEnv)")
        return found

    def _host_path_problem(self, host_path: str) -> str:
        if os.path.normpath(host_path) != host_path or host_path.startswith("//"):
            return f"{host_path[:80]!r} must be a normalised absolute path (no '.', '..', '//')"
        if not self.allowed_host_paths:
            return "host paths are not allowed on this cluster (allowedHostPaths is empty)"
        if any(_under(host_path, prefix) for prefix in self.allowed_host_paths):
            return ""
        allowed = ", ".join(self.allowed_host_paths)
        return f"{host_path[:80]!r} is not under an allowed prefix (allowedHostPaths: {allowed})"


def _under(path: str, prefix: str) -> bool:
    prefix = prefix.rstrip("/") or "/"
    return path == prefix or path.startswith(prefix if prefix == "/" else prefix + "/")


def _templates(spec: JobSpec) -> Iterable[tuple[str, PodTemplate]]:
    yield "spec.leader.template", spec.leader
    for i, ws in enumerate(spec.worker_sets):
        yield f"spec.workerSets[{i}].template", ws.template


def may_change(caller: Principal, job: JobRecord) -> bool:
    """may_change: whether the caller may stop, delete or change the job."""
    return caller.owns(job.owner)


def may_read_private(caller: Principal, job: JobRecord) -> bool:
    """may_read_private: whether the caller may see the job's environment, arguments, host
    paths and logs."""
    return caller.owns(job.owner)


def redact(msg: job_pb2.TYJob) -> job_pb2.TYJob:
    """redact hides, in place, what only a job's owner and admins may see: environment values,
    command arguments (the program's name stays), volumes' host paths, a sweep's values (its
    parameters' names stay) and the package's hash
    (with it, a job of another user's could name the package and read its files)."""
    spec = msg.spec
    if spec.HasField("package"):
        spec.package.sha256 = REDACTED
    for template in [spec.leader.template, *(ws.template for ws in spec.worker_sets)]:
        for key in template.env:
            template.env[key] = REDACTED
        if len(template.command) > 1:
            del template.command[1:]
            template.command.append(REDACTED)
        if template.args:
            del template.args[:]
            template.args.append(REDACTED)
    for volume in spec.volumes:
        volume.host_path = REDACTED
    for values in spec.sweep.parameters.values():  # a sweep's values, as its arguments
        for value in values.values:
            value.string_value = REDACTED
    return msg
