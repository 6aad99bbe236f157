"""calls: what every handler of the client API (`arranger.v1.Arranger`) shares: its ports,
and the refusals they all answer alike.

Every handler runs as the caller the gatekeeper identified (`identity.caller()`) and asks
`access` what that caller may do and see. Refusals are gRPC statuses with one clear line:
INVALID_ARGUMENT naming the field path, PERMISSION_DENIED naming what was refused and why,
RESOURCE_EXHAUSTED naming the limit, NOT_FOUND, ALREADY_EXISTS, UNAVAILABLE when a node or the
store cannot answer.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import grpc
import structlog

from arranger.identity import caller
from arranger.sched import Res
from arranger.server.access import may_change, may_read_private, redact
from arranger.server.admission import Admission
from arranger.server.agent_link import AgentLink
from arranger.server.controller import Controller
from arranger.server.convert import job_to_proto, resources_to_proto
from arranger.server.effects import Effects
from arranger.server.exec_relay import ExecRelay
from arranger.server.explain_api import Explainer
from arranger.server.limits import ListGate
from arranger.server.model import ExperimentRecord, JobRecord, PodRecord
from arranger.server.packages import Packages
from arranger.server.ports import Clock, Commit, Deserved, StoreReads, Submissions
from arranger.server.queues import QueueRecord, queue_to_proto
from arranger.server.redaction import scrub_status
from arranger.server.reports import ReportBook
from arranger.server.store import StoreError
from arranger.server.usage import UsageBook
from arranger.server.watch import WatchHub
from arranger.states import Stage
from arranger.v1 import arranger_pb2, job_pb2

Context = grpc.aio.ServicerContext[Any, Any]
log = structlog.get_logger("arranger.server")


class Calls:
    """Calls holds the API's ports. It changes the controller's records only by its stimuli
    (`controller`), made durable through `commit`, and reads them only through its view
    (`view`)."""

    def __init__(
        self,
        controller: Controller,
        commit: Commit,
        clock: Clock,
        admission: Admission,
        submissions: Submissions,
        reads: StoreReads,
        packages: Packages,
        watch: WatchHub,
        usage: UsageBook,
        links: Mapping[str, AgentLink],
        deserved: Deserved,
        explainer: Explainer,
        lists: ListGate,
        execs: ExecRelay | None = None,
        reports: ReportBook | None = None,
    ) -> None:
        self.controller, self.view = controller, controller.view
        self.commit, self.clock, self.admission = commit, clock, admission
        self.submissions, self.reads, self.packages = submissions, reads, packages
        self.watch, self.usage, self.links, self.deserved = watch, usage, links, deserved
        self.explainer, self.lists = explainer, lists
        self.execs = execs if execs is not None else ExecRelay()
        self.reports = reports if reports is not None else ReportBook()
        self.fleet = admission.fleet

    async def _job(self, name: str, context: Context) -> JobRecord:
        """_job: the job a name or an id means (NOT_FOUND if none). A caller confined to one
        job (a job token) reaches that job by its id or its name, whatever another job is
        named, and is refused any other name, known or not (it learns of no other job)."""
        confined = caller().job
        if confined:
            own = self.view.job(confined)
            if own is None or own.deleted or name not in (own.id, own.name):
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"name: a job token reaches its own job only (job id {confined})",
                )
                raise AssertionError  # abort raises
            return own
        job = self.view.find(name) if name else None
        means = self.view.named(name) if job is not None else None
        if job is not None and isinstance(means, ExperimentRecord):
            # A name means the newest of its jobs and experiments: an older job is reached by
            # its id.
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"job {name!r} not found: the name means experiment {name} (id {means.id}), "
                f"submitted later; the job is reached by its id ({job.id})",
            )
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"job {name!r} not found")
            raise AssertionError
        return job

    async def _pod(self, job: JobRecord, name: str, context: Context) -> PodRecord:
        """_pod: the job's pod of that name, with or without the job's name before it ("":
        the leader; NOT_FOUND if none)."""
        if not name:
            return job.leader
        pod = job.pods.get(name) or job.pods.get(f"{job.name}-{name}")
        if pod is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"job {job.name} has no pod {name!r}")
            raise AssertionError
        return pod

    async def _may_change(self, job: JobRecord, what: str, context: Context) -> None:
        if not may_change(caller(), job):
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{what} job {job.name!r}: it belongs to {job.owner or 'nobody'!r}; only its "
                "owner or an admin may",
            )

    async def _admin(self, what: str, context: Context) -> None:
        who = caller()
        if not who.admin:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{what}: needs the admin role; user {who.user!r} has the {who.role.value} role",
            )

    async def _commit(self, context: Context, fx: Effects) -> None:
        """_commit stores a change; one that cannot be stored is UNAVAILABLE with the store's
        reason (memory is as before it, and nothing was ordered)."""
        try:
            await self.commit(fx)
        except StoreError as exc:
            log.error("change not stored", error=str(exc))
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"not stored: {exc}")

    def _visible(self, job: JobRecord) -> job_pb2.TYJob:
        """_visible: the job as the caller may see it (another user's secrets redacted, from
        its spec and from its status's messages)."""
        msg = job_to_proto(job, self.view.address)
        msg.status.retry_limit = self.controller.config.transient_retry_limit
        if may_read_private(caller(), job):
            return msg
        scrub_status(msg.status, job.spec)
        return redact(msg)

    def _queue_reply(self, queue: QueueRecord) -> arranger_pb2.Queue:
        msg = queue_to_proto(queue)
        used = Res()
        for job in self.view.jobs_in_queue(queue.name):
            if job.stage == Stage.PENDING:
                msg.status.pending_jobs += 1
            elif not job.stage.finished:
                msg.status.running_jobs += 1
            for pod in job.pods.values():
                if pod.state.holds_resources:
                    res = job.spec.template_of(pod.worker_set).resources
                    used = used + Res(res.cpu_milli, res.memory_bytes, res.gpu_milli)
        resources_to_proto(used, msg.status.allocated)
        resources_to_proto(self.deserved().get(queue.name, Res()), msg.status.deserved)
        return msg

    async def _may_list(self, context: Context) -> None:
        """_may_list refuses a page of events or history past the caller's rate."""
        refused = self.lists.problem(caller(), time.monotonic())
        if refused:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)

    # Elastic jobs.
