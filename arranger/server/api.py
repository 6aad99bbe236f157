"""api serves arranger.v1.Arranger, the client API.

Every handler runs as the caller the gatekeeper identified (`identity.caller()`) and asks
`access` what that caller may do and see. Refusals are gRPC statuses with one clear line:
INVALID_ARGUMENT naming the field path, PERMISSION_DENIED naming what was refused and why,
RESOURCE_EXHAUSTED naming the limit, NOT_FOUND, ALREADY_EXISTS, UNAVAILABLE when a node or the
store cannot answer.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import structlog

from arranger.identity import caller
from arranger.sched import Res
from arranger.server.access import may_change, may_read_private, redact
from arranger.server.convert import (
    job_summary,
    job_to_proto,
    node_to_proto,
    resources_to_proto,
)
from arranger.server.effects import Effects
from arranger.server.events_api import list_events
from arranger.server.explain_api import Explainer, explanation_reply
from arranger.server.fit import FleetCache, capacity_warnings
from arranger.server.history_api import DEFAULT_PAGE, MAX_PAGE, list_history
from arranger.server.limits import ListGate
from arranger.server.listing import FIRST, Key, key_of, key_token, parse_key
from arranger.server.logtail import log_chunks
from arranger.server.model import JobRecord, NodeRecord, PodRecord
from arranger.server.packages import PackageRefused, Packages
from arranger.server.queues import QueueInvalid, QueueRecord, parse_queue, queue_to_proto
from arranger.server.redaction import scrub_status
from arranger.server.scaling import scale_problem
from arranger.server.store import StoreError
from arranger.server.usage import add_usage, usage_to_proto
from arranger.server.validation import SpecInvalid, parse_job
from arranger.server.watch import ADDED, SYNCED, Change, Position
from arranger.spec import DEFAULT_QUEUE
from arranger.states import Stage
from arranger.v1 import arranger_pb2, arranger_pb2_grpc, job_pb2, node_pb2

if TYPE_CHECKING:
    from arranger.server.app import ArrangerServer

Context = grpc.aio.ServicerContext[Any, Any]
log = structlog.get_logger("arranger.server")


T = TypeVar("T")


class ApiServicer(arranger_pb2_grpc.ArrangerServicer):
    """ApiServicer changes the controller's records only by its stimuli (`controller`) and
    reads them only through its view (`view`)."""

    def __init__(self, server: ArrangerServer) -> None:
        self.server = server
        self.controller = server.controller
        self.view = server.controller.view
        limits = server.config.limits
        self.packages = Packages(
            lambda: server.store,
            self.view,
            limits.package_bytes,
            limits.stored_package_bytes_per_user,
        )
        self.fleet = FleetCache(self.view.nodes, self.view.node_count, time.monotonic)
        self.explainer = Explainer(server.state, server.config.scheduler, server.clock)
        self.lists = ListGate(server.config.limits)

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
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"job {name!r} not found")
            raise AssertionError
        return job

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
            await self.server.commit(fx)
        except StoreError as exc:
            log.error("change not stored", error=str(exc))
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"not stored: {exc}")

    def _visible(self, job: JobRecord) -> job_pb2.TYJob:
        """_visible: the job as the caller may see it (another user's secrets redacted, from
        its spec and from its status's messages)."""
        msg = job_to_proto(job, self.view.address)
        if may_read_private(caller(), job):
            return msg
        scrub_status(msg.status, job.spec)
        return redact(msg)

    async def SubmitJob(
        self, request: arranger_pb2.SubmitJobRequest, context: Context
    ) -> arranger_pb2.SubmitJobResponse:
        who = caller()
        size = request.job.ByteSize()
        limit = self.server.config.limits.spec_bytes
        if size > limit:  # before parsing: a huge spec costs nothing more
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"limits.specBytes: the job's spec is {size} bytes, above the limit of {limit}",
            )
        try:
            spec = parse_job(request.job)
        except SpecInvalid as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise
        queue = self.view.queue(spec.queue)
        if queue is None:
            known = ", ".join(q.name for q in self.view.queues())
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"metadata.queue: queue {spec.queue!r} does not exist (queues: {known})",
            )
            raise AssertionError
        above = self.controller.config.above_maxima(spec)
        above += self.server.config.limits.above_maxima(spec)
        if above:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(above))
        problems = self.server.config.policy.problems(spec, who, queue)
        if problems:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "; ".join(problems))
        if spec.package is not None:
            try:
                owner = None if who.admin else who.user  # admins may name any package
                missing = await self.packages.missing(request.job.spec.package, owner)
            except StoreError as exc:
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"the store cannot answer: {exc}")
                raise
            if missing:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, missing)
        running = self.view.unfinished(spec.name)
        if running is not None:
            await context.abort(
                grpc.StatusCode.ALREADY_EXISTS,
                f"metadata.name: job {spec.name!r} (id {running.id}) has not finished; stop it, "
                "wait for it to end, or pick another name",
            )
        pods = 1 + spec.num_workers
        refused = self.server.submits.problem(who, pods, time.monotonic(), size)
        if refused:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
        try:
            job = await self.server.submit(spec, who.user)
        except StoreError as exc:
            log.error("submit not stored", job=spec.name, error=str(exc))
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"the job was not stored: {exc}")
            raise
        warnings = capacity_warnings(spec, self.fleet.fleet())
        return arranger_pb2.SubmitJobResponse(job=job_to_proto(job), warnings=warnings)

    async def HasPackage(
        self, request: arranger_pb2.HasPackageRequest, context: Context
    ) -> arranger_pb2.HasPackageResponse:
        has = self.packages.has(request.sha256, self.server.clock())
        return await _package_call(has, context, "the store cannot answer")

    async def UploadPackage(
        self, request_iterator: AsyncIterator[arranger_pb2.UploadPackageRequest], context: Context
    ) -> arranger_pb2.UploadPackageResponse:
        upload = self.packages.upload(request_iterator, self.server.clock())
        return await _package_call(upload, context, "the package was not stored")

    async def GetJob(self, request: arranger_pb2.GetJobRequest, context: Context) -> job_pb2.TYJob:
        msg = self._visible(await self._job(request.name, context))
        add_usage(msg, self.server.usage)
        return msg

    async def ListJobs(
        self, request: arranger_pb2.ListJobsRequest, context: Context
    ) -> arranger_pb2.ListJobsResponse:
        size = request.page_size or DEFAULT_PAGE
        if not 0 < size <= MAX_PAGE:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"pageSize: must be 1..{MAX_PAGE}"
            )
        stages = set(request.stages)
        unknown = stages - {s.value for s in Stage}
        if unknown:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"stages: unknown stage {sorted(unknown)[0]!r}"
            )
        if request.mine and request.owner:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "owner: give an owner or mine, not both"
            )
        after = None
        if request.page_token:
            after = parse_key(request.page_token)
            if after is None:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "pageToken: not a token ListJobs gave; start again without one",
                )
        owner = caller().user if request.mine else request.owner or None
        unannounced = self.server.unannounced
        page: list[JobRecord] = []
        more = False
        for job in self.view.listed(after, owner):
            if (
                job.id in unannounced
                or (request.queue and job.spec.queue != request.queue)
                or (stages and job.stage.value not in stages)
            ):
                continue
            if len(page) == size:
                more = True
                break
            page.append(job)
        hub = self.server.watch
        reply = arranger_pb2.ListJobsResponse(
            jobs=[job_summary(j) for j in page], resume_token=hub.token(hub.seq)
        )
        usage = self.server.usage
        for job, summary in zip(page, reply.jobs, strict=True):
            if job.id in usage.totals:
                usage_to_proto(usage.job_now(job.id), summary.usage)
        if more:
            reply.next_page_token = key_token(key_of(page[-1]))
        return reply

    async def WatchJobs(
        self, request: arranger_pb2.WatchJobsRequest, context: Context
    ) -> AsyncIterator[arranger_pb2.WatchJobsResponse]:
        hub = self.server.watch
        if request.resume_token:
            at = hub.position(request.resume_token)
            if at is None:
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "resumeToken: the server no longer holds the changes after it (it keeps "
                    "the most recent ones, of this run only); watch again without a token",
                )
                raise AssertionError
        else:
            at = Position(hub.seq, listing=FIRST)
        # A name is followed as the job it means now: a later job of the same name is another.
        target, by_id = request.name, False
        if caller().job:
            target, by_id = (await self._job(request.name, context)).id, True
        elif request.name:
            found = self.view.find(request.name)
            if found is None and not request.resume_token:
                await self._job(request.name, context)
            if found is not None:
                target, by_id = found.id, True
        # From here to the first yield nothing awaits: the subscription gets every change after
        # hub.seq, `missed` every change from the token's up to it.
        sub = hub.subscribe(target, by_id)
        try:
            missed = hub.since(at.seq)
            if at.listing is not None:
                for msg in self._listing(target, by_id, at.seq, at.listing, missed):
                    yield msg
            for change in missed:
                if sub.wants(change):
                    yield self._timed(change)
            while True:
                item = await sub.queue.get()
                if item is None:
                    if sub.overflowed:
                        await context.abort(
                            grpc.StatusCode.RESOURCE_EXHAUSTED,
                            "watcher fell too far behind; resume with the last resume token",
                        )
                    return
                yield self._timed(item)
        finally:
            hub.unsubscribe(sub)

    def _listing(
        self, name: str, by_id: bool, seq: int, after: Key, missed: list[Change]
    ) -> Iterator[arranger_pb2.WatchJobsResponse]:
        """_listing: a watch's initial ADDEDs, as of change `seq`, from after the job `after`,
        then SYNCED. The jobs are those listed now (the one job `name` means, an id when
        `by_id`) less those submitted after `seq` (`missed` has their ADDED, or the
        subscription will); each summary is made as it is sent, so a change that follows may
        already show in it."""
        hub = self.server.watch
        later = {c.job_id for c in missed if c.msg.type == ADDED} | self.server.unannounced
        if name:
            job = self.view.job(name) if by_id else self.view.find(name)
            ids = [job.id] if job is not None and key_of(job) > after else []
        else:
            ids = [job.id for job in self.view.listed(after)]
        for job_id in ids:
            job = self.view.job(job_id)
            if job is None or job.deleted or job_id in later:
                continue
            msg = arranger_pb2.WatchJobsResponse(
                type=ADDED,
                name=job.name,
                id=job.id,
                summary=job_summary(job),
                resume_token=hub.token(seq, key_of(job)),
            )
            yield msg
        yield self._stamped(
            arranger_pb2.WatchJobsResponse(type=SYNCED, resume_token=hub.token(seq))
        )

    def _timed(self, change: Change) -> arranger_pb2.WatchJobsResponse:
        """_timed: a change whose pods are under notice, as sent now, with the server's clock
        (a copy: the change is shared by every watcher); any other change as it is."""
        if not change.noticed:
            return change.msg
        timed = arranger_pb2.WatchJobsResponse()
        timed.CopyFrom(change.msg)
        return self._stamped(timed)

    def _stamped(self, msg: arranger_pb2.WatchJobsResponse) -> arranger_pb2.WatchJobsResponse:
        """_stamped: `msg`, its server_time set to the server's clock now."""
        msg.server_time.FromNanoseconds(int(self.server.clock() * 1e9))
        return msg

    async def StopJob(
        self, request: arranger_pb2.StopJobRequest, context: Context
    ) -> job_pb2.TYJob:
        job = await self._job(request.name, context)
        await self._may_change(job, "stop", context)
        await self._commit(context, self.controller.stop(job, self.server.clock(), caller().user))
        return self._visible(job)

    async def DeleteJob(
        self, request: arranger_pb2.DeleteJobRequest, context: Context
    ) -> arranger_pb2.DeleteJobResponse:
        job = await self._job(request.name, context)
        await self._may_change(job, "delete", context)
        await self._commit(context, self.controller.delete(job, self.server.clock()))
        return arranger_pb2.DeleteJobResponse()

    async def GetLogs(
        self, request: arranger_pb2.GetLogsRequest, context: Context
    ) -> AsyncIterator[arranger_pb2.LogChunk]:
        job = await self._job(request.job, context)
        if not may_read_private(caller(), job):
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"logs of job {job.name!r}: it belongs to {job.owner or 'nobody'!r}; only its "
                "owner or an admin may read them",
            )
        pod = await self._pod(job, request.pod, context)
        if request.tail_lines < 0 or request.tail_bytes < 0:
            field = "tail_lines" if request.tail_lines < 0 else "tail_bytes"
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: must be >= 0")
        if request.tail_lines and request.tail_bytes:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "tail_lines: give tail_lines or tail_bytes, not both",
            )
        attempt = request.attempt if request.HasField("attempt") else pod.attempt
        if not 0 <= attempt <= pod.attempt:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"attempt: pod {pod.name} has attempts 0..{pod.attempt}",
            )
        if not pod.node:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"pod {pod.name} has not been placed on a node"
            )
        link = self.server.links.get(pod.node)
        if link is None:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"node {pod.node} is not connected; its logs are unreachable",
            )
            return
        async for chunk in log_chunks(link, pod.uid, attempt, request, context):
            yield chunk

    async def _pod(self, job: JobRecord, name: str, context: Context) -> PodRecord:
        if not name:
            return job.leader
        pod = job.pods.get(name) or job.pods.get(f"{job.name}-{name}")
        if pod is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"job {job.name} has no pod {name!r}")
            raise AssertionError
        return pod

    async def ListNodes(
        self, request: arranger_pb2.ListNodesRequest, context: Context
    ) -> arranger_pb2.ListNodesResponse:
        return arranger_pb2.ListNodesResponse(
            nodes=[self._node_reply(node) for node in self.view.nodes()]
        )

    async def _node(self, name: str, context: Context) -> NodeRecord:
        node = self.view.node(name)
        if node is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"node {name!r} not found")
            raise AssertionError
        return node

    def _node_reply(self, node: NodeRecord) -> node_pb2.Node:
        held = self.view.pods_on(node.name)
        specs = {job.id: job.spec for job, _ in held}
        return node_to_proto(node, [pod for _, pod in held], specs, self.server.clock())

    async def CordonNode(
        self, request: arranger_pb2.CordonNodeRequest, context: Context
    ) -> node_pb2.Node:
        await self._admin("cordon " + request.name, context)
        node = await self._node(request.name, context)
        await self._commit(
            context, self.controller.cordon(node.name, request.cordon, self.server.clock())
        )
        return self._node_reply(node)

    async def DrainNode(
        self, request: arranger_pb2.DrainNodeRequest, context: Context
    ) -> node_pb2.Node:
        await self._admin("drain " + request.name, context)
        node = await self._node(request.name, context)
        await self._commit(context, self.controller.drain(node.name, self.server.clock()))
        return self._node_reply(node)

    async def ExplainJob(
        self, request: arranger_pb2.ExplainJobRequest, context: Context
    ) -> arranger_pb2.ExplainJobResponse:
        job = await self._job(request.name, context)
        reply = arranger_pb2.ExplainJobResponse(job=self._visible(job))
        found = await self.explainer.explain(job.id)
        if found is None:  # nothing to place or hold: finished, stopping, or deleted
            reply.decision, reply.message = job.schedule_state.value, job.message
            return reply
        queue = self.view.queue(found.queue)
        queue_msg = self._queue_reply(queue) if queue is not None else None
        explanation_reply(found, reply, self.view.node_count(), queue_msg)
        return reply

    # Queues.

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
        resources_to_proto(self.server.deserved.get(queue.name, Res()), msg.status.deserved)
        return msg

    async def ListQueues(
        self, request: arranger_pb2.ListQueuesRequest, context: Context
    ) -> arranger_pb2.ListQueuesResponse:
        return arranger_pb2.ListQueuesResponse(
            queues=[self._queue_reply(q) for q in self.view.queues()]
        )

    async def _parsed_queue(self, msg: arranger_pb2.Queue, context: Context) -> QueueRecord:
        try:
            return parse_queue(msg)
        except QueueInvalid as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise

    async def CreateQueue(
        self, request: arranger_pb2.CreateQueueRequest, context: Context
    ) -> arranger_pb2.Queue:
        await self._admin("create queues", context)
        queue = await self._parsed_queue(request.queue, context)
        if self.view.queue(queue.name) is not None:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"queue {queue.name!r} exists")
        await self._commit(context, self.controller.put_queue(queue, self.server.clock()))
        return self._queue_reply(queue)

    async def UpdateQueue(
        self, request: arranger_pb2.UpdateQueueRequest, context: Context
    ) -> arranger_pb2.Queue:
        await self._admin("update queues", context)
        queue = await self._parsed_queue(request.queue, context)
        if self.view.queue(queue.name) is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"queue {queue.name!r} not found")
        await self._commit(context, self.controller.put_queue(queue, self.server.clock()))
        return self._queue_reply(queue)

    async def DeleteQueue(
        self, request: arranger_pb2.DeleteQueueRequest, context: Context
    ) -> arranger_pb2.DeleteQueueResponse:
        await self._admin("delete queues", context)
        name = request.name
        if self.view.queue(name) is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"queue {name!r} not found")
        if name == DEFAULT_QUEUE:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, "the default queue cannot be deleted"
            )
        in_use = self.view.queue_in_use(name)
        if in_use:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"queue {name!r} has {in_use} unfinished jobs; stop or delete them first",
            )
        await self._commit(context, self.controller.delete_queue(name, self.server.clock()))
        return arranger_pb2.DeleteQueueResponse()

    async def ListEvents(
        self, request: arranger_pb2.ListEventsRequest, context: Context
    ) -> arranger_pb2.ListEventsResponse:
        job_id = ""
        if request.job:
            job_id = (await self._job(request.job, context)).id
        await self._may_list(context)
        await self.server.writes.written()  # events are read from the store: as memory shows them
        return await list_events(self.server.store, job_id, request, context)

    async def ListHistory(
        self, request: arranger_pb2.ListHistoryRequest, context: Context
    ) -> arranger_pb2.ListHistoryResponse:
        await self._may_list(context)
        await self.server.writes.written()
        return await list_history(self.server.store, request, context)

    async def _may_list(self, context: Context) -> None:
        """_may_list refuses a page of events or history past the caller's rate."""
        refused = self.lists.problem(caller(), time.monotonic())
        if refused:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)

    # Elastic jobs.

    async def ScaleJob(
        self, request: arranger_pb2.ScaleJobRequest, context: Context
    ) -> job_pb2.TYJob:
        job = await self._job(request.name, context)
        await self._may_change(job, "scale", context)
        problem = scale_problem(job, request.worker_set, request.counts)
        if problem is not None:
            await context.abort(grpc.StatusCode[problem[0]], problem[1])
        who = caller()
        by = f"job token of {job.name}" if who.job else who.user
        now = self.server.clock()
        fx = self.controller.scale(job, request.worker_set, request.counts, now, by)
        await self._commit(context, fx)
        return self._visible(job)

    async def ConfirmCheckpoint(
        self, request: arranger_pb2.ConfirmCheckpointRequest, context: Context
    ) -> job_pb2.TYJob:
        job = await self._job(request.name, context)
        await self._may_change(job, "confirm a checkpoint of", context)
        fx = self.controller.confirm_checkpoint(job, self.server.clock())
        if fx is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"job {job.name!r} has ended; no checkpoint of it is kept",
            )
            raise AssertionError
        await self._commit(context, fx)
        return self._visible(job)


async def _package_call(call: Awaitable[T], context: Context, unstored: str) -> T:
    """_package_call: what a package call answers; its refusals and the store's failures
    (UNAVAILABLE, prefixed `unstored`) as the caller's error."""
    try:
        return await call
    except PackageRefused as exc:
        await context.abort(grpc.StatusCode[exc.code], exc.message)
        raise
    except StoreError as exc:
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"{unstored}: {exc}")
        raise
