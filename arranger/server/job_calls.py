"""job_calls: the client API's calls on jobs: submit, read, list and watch, stop, delete,
logs, explain, scale, checkpoints (see calls for what they share)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Iterable, Iterator

import grpc
import structlog

from arranger.identity import caller
from arranger.server.access import may_read_private
from arranger.server.admission import Refusal
from arranger.server.calls import Calls, Context
from arranger.server.convert import job_summary, job_to_proto
from arranger.server.experiment_calls import experiment_summary
from arranger.server.explain_api import explanation_reply
from arranger.server.fit import capacity_warnings
from arranger.server.listing import FIRST, Key, key_of, key_token, parse_key
from arranger.server.logtail import log_chunks
from arranger.server.model import JobRecord
from arranger.server.record_pages import DEFAULT_PAGE, MAX_PAGE
from arranger.server.scaling import scale_problem
from arranger.server.store import StoreError
from arranger.server.usage import add_usage, usage_to_proto
from arranger.server.watch import ADDED, SYNCED, Change, Position
from arranger.states import Stage
from arranger.v1 import arranger_pb2, job_pb2

log = structlog.get_logger("arranger.server")


class JobCalls(Calls):
    """JobCalls: the calls on jobs (see the module)."""

    async def SubmitJob(
        self, request: arranger_pb2.SubmitJobRequest, context: Context
    ) -> arranger_pb2.SubmitJobResponse:
        who = caller()
        spec = await self.admission.admit(request.job, who, request.queue_anyway)
        if isinstance(spec, Refusal):
            await context.abort(grpc.StatusCode[spec.code], spec.message)
            raise AssertionError  # abort raises
        warnings = capacity_warnings(spec, self.fleet.fleet())
        try:
            if spec.sweep is not None:
                exp = await self.submissions.submit_experiment(spec, who.user)
                summary = experiment_summary(exp, self.view.members(exp))
                return arranger_pb2.SubmitJobResponse(experiment=summary, warnings=warnings)
            job = await self.submissions.submit(spec, who.user)
        except StoreError as exc:
            log.error("submit not stored", job=spec.name, error=str(exc))
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"the job was not stored: {exc}")
            raise
        return arranger_pb2.SubmitJobResponse(job=job_to_proto(job), warnings=warnings)

    async def GetJob(self, request: arranger_pb2.GetJobRequest, context: Context) -> job_pb2.TYJob:
        msg = self._visible(await self._job(request.name, context))
        add_usage(msg, self.usage)
        return msg

    async def ListJobs(
        self, request: arranger_pb2.ListJobsRequest, context: Context
    ) -> arranger_pb2.ListJobsResponse:
        size = request.page_size or DEFAULT_PAGE
        if not 0 < size <= MAX_PAGE:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"pageSize: must be 1..{MAX_PAGE}"
            )
        named = {s.value.lower(): s.value for s in Stage}  # a stage is named in any case
        stages = {named.get(s.lower(), s) for s in request.stages}
        unknown = stages - {s.value for s in Stage}
        if unknown:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"stages: unknown stage {sorted(unknown)[0][:64]!r} (one of {', '.join(Stage)})",
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
        unannounced = self.submissions.unannounced
        page: list[JobRecord] = []
        more = False
        listed = self.view.listed(after, owner)
        if request.experiment:
            exp = self.view.experiment(request.experiment)
            if exp is None:
                await context.abort(
                    grpc.StatusCode.NOT_FOUND,
                    f"experiment: no experiment {request.experiment[:64]!r} is kept",
                )
                raise AssertionError
            listed = members_after(self.view.members(exp), after, owner)
        for job in listed:
            if (
                job.id in unannounced
                or (request.queue and job.spec.queue != request.queue)
                or (stages and job.stage.value not in stages)
                or (request.fold and job.experiment)
            ):
                continue
            if len(page) == size:
                more = True
                break
            page.append(job)
        hub = self.watch
        reply = arranger_pb2.ListJobsResponse(
            jobs=[job_summary(j) for j in page], resume_token=hub.token(hub.seq)
        )
        usage = self.usage
        for job, summary in zip(page, reply.jobs, strict=True):
            if job.id in usage.totals:
                usage_to_proto(usage.job_now(job.id), summary.usage)
        if more:
            reply.next_page_token = key_token(key_of(page[-1]))
        if request.fold and not request.page_token:
            reply.experiments.extend(self._experiments(owner, request.queue, unannounced))
        return reply

    def _experiments(
        self, owner: str | None, queue: str, unannounced: Collection[str]
    ) -> list[job_pb2.ExperimentSummary]:
        """_experiments: the experiments a folded listing shows, oldest first."""
        found = []
        for exp in self.view.experiments():
            if (owner is not None and exp.owner != owner) or (queue and exp.spec.queue != queue):
                continue
            if not exp.members or exp.members[0] in unannounced:
                continue
            summary = experiment_summary(exp, self.view.members(exp))
            if not summary.deleted:
                found.append((exp.submit_time, exp.id, summary))
        return [summary for _, _, summary in sorted(found, key=lambda f: f[:2])]

    async def WatchJobs(
        self, request: arranger_pb2.WatchJobsRequest, context: Context
    ) -> AsyncIterator[arranger_pb2.WatchJobsResponse]:
        hub = self.watch
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
        hub = self.watch
        later = {c.job_id for c in missed if c.msg.type == ADDED} | self.submissions.unannounced
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
        msg.server_time.FromNanoseconds(int(self.clock() * 1e9))
        return msg

    async def StopJob(
        self, request: arranger_pb2.StopJobRequest, context: Context
    ) -> job_pb2.TYJob:
        job = await self._job(request.name, context)
        await self._may_change(job, "stop", context)
        await self._commit(context, self.controller.stop(job, self.clock(), caller().user))
        return self._visible(job)

    async def DeleteJob(
        self, request: arranger_pb2.DeleteJobRequest, context: Context
    ) -> arranger_pb2.DeleteJobResponse:
        job = await self._job(request.name, context)
        await self._may_change(job, "delete", context)
        await self._commit(context, self.controller.delete(job, self.clock()))
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
        link = self.links.get(pod.node)
        if link is None:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"node {pod.node} is not connected; its logs are unreachable",
            )
            return
        newest = "" if request.HasField("attempt") else pod.name  # then the newest with a log
        async for chunk in log_chunks(link, pod.uid, attempt, request, context, newest):
            yield chunk

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
        explanation_reply(found, reply, queue_msg)
        return reply

    # Queues.

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
        now = self.clock()
        fx = self.controller.scale(job, request.worker_set, request.counts, now, by)
        await self._commit(context, fx)
        return self._visible(job)

    async def ConfirmCheckpoint(
        self, request: arranger_pb2.ConfirmCheckpointRequest, context: Context
    ) -> job_pb2.TYJob:
        job = await self._job(request.name, context)
        await self._may_change(job, "confirm a checkpoint of", context)
        fx = self.controller.confirm_checkpoint(job, self.clock())
        if fx is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"job {job.name!r} has ended; no checkpoint of it is kept",
            )
            raise AssertionError
        await self._commit(context, fx)
        return self._visible(job)


def members_after(
    jobs: Iterable[JobRecord], after: Key | None, owner: str | None
) -> Iterator[JobRecord]:
    """members_after: an experiment's members not deleted, in listing order (their submit
    order), after the key `after`, of `owner` only when given."""
    for job in jobs:
        later = after is None or key_of(job) > after
        if later and not job.deleted and (owner is None or job.owner == owner):
            yield job
