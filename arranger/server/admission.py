"""admission: whether a submitted job may be taken, decided before `Controller.submit`.

The checks run in a fixed order, cheapest first, and the first that fails is the answer: the
spec's size (before it is parsed), its fields (validation), its queue, this server's maxima,
the submit policy, its package, its name among unfinished jobs, the caller's limits (its rate
is charged whether or not the last check refuses), whether it could ever fit the registered
nodes (unless the caller asks to queue it anyway). A refusal is a value naming the field or
the limit and the gRPC status it is answered with; a spec that passes is returned parsed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from arranger.identity import Principal
from arranger.server.config import ServerConfig
from arranger.server.controller_config import ControllerConfig
from arranger.server.convert import spec_to_json
from arranger.server.fit import FleetCache, never_fits
from arranger.server.limits import SubmitGate
from arranger.server.model import JobRecord
from arranger.server.packages import Packages
from arranger.server.spec_bounds import BOUNDS
from arranger.server.store import StoreError
from arranger.server.validation import SpecInvalid, parse_job
from arranger.server.view import ClusterView
from arranger.spec import JobSpec
from arranger.sweep import longest_member, member_name
from arranger.v1 import job_pb2


@dataclass(frozen=True)
class Refusal:
    """Refusal: why a job is not taken; `code` names the gRPC status that answers it."""

    code: str
    message: str


class Admission:
    """Admission decides submits (see the module) from the cluster as `view` shows it now."""

    def __init__(
        self,
        view: ClusterView,
        controller: ControllerConfig,
        config: ServerConfig,
        packages: Packages,
        submits: SubmitGate,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._view, self._controller, self._config = view, controller, config
        self._packages, self._submits, self._monotonic = packages, submits, monotonic
        self.fleet = FleetCache(view.nodes, view.node_count, monotonic)
        self.submits = submits  # what each user holds, read by the calls that add to it

    async def admit(
        self, job: job_pb2.TYJob, who: Principal, queue_anyway: bool = False
    ) -> JobSpec | Refusal:
        """admit: the parsed spec of a job `who` may submit now, or why not. `queue_anyway`:
        take a job no registered node could ever hold (a node may join)."""
        size = job.ByteSize()
        limit = self._config.limits.spec_bytes
        if size > limit:  # before parsing: a huge spec costs nothing more
            return Refusal(
                "RESOURCE_EXHAUSTED",
                f"limits.specBytes: the job's spec is {size} bytes, above the limit of {limit}",
            )
        try:
            spec = parse_job(job)
        except SpecInvalid as exc:
            return Refusal("INVALID_ARGUMENT", str(exc))
        queue = self._view.queue(spec.queue)
        if queue is None:
            known = ", ".join(q.name for q in self._view.queues())
            return Refusal(
                "INVALID_ARGUMENT",
                f"metadata.queue: queue {spec.queue!r} does not exist (queues: {known})",
            )
        above = self._controller.above_maxima(spec) + self._config.limits.above_maxima(spec)
        if above:
            return Refusal("INVALID_ARGUMENT", "; ".join(above))
        problems = self._config.policy.problems(spec, who, queue)
        if problems:
            return Refusal("PERMISSION_DENIED", "; ".join(problems))
        if spec.package is not None:
            owner = None if who.admin else who.user  # admins may name any package
            try:
                missing = await self._packages.missing(job.spec.package, owner)
            except StoreError as exc:
                return Refusal("UNAVAILABLE", f"the store cannot answer: {exc}")
            if missing:
                return Refusal("FAILED_PRECONDITION", missing)
        resolved = []
        for i, dep in enumerate(spec.depends_on):  # by id from now on: a name may be used again
            other = self._view.named(dep.job)
            if other is None:
                return Refusal(
                    "INVALID_ARGUMENT",
                    f"spec.dependsOn[{i}].job: no job or experiment {dep.job!r} is kept (a "
                    "name or an id)",
                )
            resolved.append(replace(dep, job=other.id))
        spec = replace(spec, depends_on=tuple(resolved))
        taken = names_taken(self._view, spec)
        if taken:
            return Refusal("ALREADY_EXISTS", taken)
        jobs, each = 1, size
        if spec.sweep is not None:
            jobs = spec.sweep.size
            if jobs > self._config.limits.members_per_experiment:
                return Refusal(
                    "RESOURCE_EXHAUSTED",
                    f"limits.membersPerExperiment: spec.sweep makes {jobs} members; this server "
                    f"allows {self._config.limits.members_per_experiment}",
                )
            each, wide = member_size(spec)
            if wide:
                return Refusal("INVALID_ARGUMENT", wide)
            if each > limit:
                return Refusal(
                    "RESOURCE_EXHAUSTED",
                    f"limits.specBytes: with the sweep's longest values a member's spec is "
                    f"{each} bytes, above the limit of {limit}",
                )
        # The caller's rate is charged first: a refused submit costs a token too.
        pods = (1 + spec.num_workers) * jobs
        refused = self._submits.problem(who, pods, self._monotonic(), each * jobs, jobs)
        if refused:
            return Refusal("RESOURCE_EXHAUSTED", refused)
        if not queue_anyway:
            never = never_fits(spec, self.fleet.registered())
            if never:  # a refusal is rare, and charged: as the nodes are now, not 5 s ago
                never = never_fits(spec, self.fleet.registered(fresh=True))
            if never:
                count = len(self.fleet.registered().nodes)
                return Refusal(
                    "FAILED_PRECONDITION",
                    "; ".join(f"{s.path}: {s.text}" for s in never)
                    + f"; it could never run on the {count} registered node"
                    + ("s" if count != 1 else "")
                    + " (counted Ready and empty); submit with --queue-anyway (queue_anyway) "
                    "to queue it for a node that may join",
                )
        return spec


def names_taken(view: ClusterView, spec: JobSpec) -> str:
    """names_taken: why the spec's name, or one of its members' (an experiment's), may not be
    taken now ("" if it may): jobs and experiments share one namespace while unfinished."""
    what = " for this experiment" if spec.sweep is not None else ""
    running = view.unfinished(spec.name)
    if running is not None:
        return (
            f"metadata.name: job {spec.name!r} (id {running.id}) has not finished; stop it, "
            f"wait for it to end, or pick another name{what}"
        )
    exp = view.running_experiment(spec.name)
    if exp is not None:
        return (
            f"metadata.name: experiment {spec.name!r} (id {exp.id}) has members that have not "
            f"finished; stop it, wait for them to end, or pick another name{what}"
        )
    for index in range(spec.sweep.size if spec.sweep is not None else 0):
        name = member_name(spec.name, index)
        taken = view.unfinished(name) or view.running_experiment(name)
        if taken is not None:
            what = "job" if isinstance(taken, JobRecord) else "experiment"
            return (
                f"metadata.name: member {index} would be named {name!r}, the name of an "
                f"unfinished {what} (id {taken.id}); pick another name for this experiment"
            )
    return ""


def member_size(spec: JobSpec) -> tuple[int, str]:
    """member_size: the most bytes a member's spec takes (as stored), and why the members'
    command lines are too long ("" if they are not): `{name}` is replaced by values longer
    than itself, so a member may be larger than the experiment's spec that was checked."""
    member = longest_member(spec, lambda value: len(value.encode()))
    templates = [("spec.leader.template", member.leader)] + [
        (f"spec.workerSets[{i}].template", ws.template) for i, ws in enumerate(member.worker_sets)
    ]
    for path, template in templates:
        argv = sum(len(a.encode()) + 1 for a in (*template.command, *template.args))
        if argv > BOUNDS.argv_bytes:
            return 0, (
                f"{path}.args: with the sweep's longest values a member's command and args "
                f"take {argv} bytes; at most {BOUNDS.argv_bytes}"
            )
    stored = longest_member(spec, lambda value: len(json.dumps(value, ensure_ascii=False).encode()))
    return len(spec_to_json(stored).encode()), ""
