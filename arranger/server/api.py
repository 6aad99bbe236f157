"""api serves arranger.v1.Arranger, the client API.

Refusals are gRPC statuses with one clear line: INVALID_ARGUMENT naming the field path,
NOT_FOUND, ALREADY_EXISTS, UNAVAILABLE when a node or the store cannot answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc
import structlog

from arranger.server.agent_link import AgentGone
from arranger.server.convert import event_to_proto, job_to_proto, node_to_proto
from arranger.server.model import JobRecord, PodRecord
from arranger.server.store import StoreError
from arranger.server.validation import SpecInvalid, parse_job
from arranger.states import Stage
from arranger.v1 import arranger_pb2, arranger_pb2_grpc, job_pb2

if TYPE_CHECKING:
    from arranger.server.app import ArrangerServer

Context = grpc.aio.ServicerContext[Any, Any]
log = structlog.get_logger("arranger.server")

LOG_CHUNK_BYTES = 1024 * 1024
LOG_FOLLOW_WAIT_S = 5.0
DEFAULT_PAGE = 500
MAX_PAGE = 5000


class ApiServicer(arranger_pb2_grpc.ArrangerServicer):
    def __init__(self, server: ArrangerServer) -> None:
        self.server = server
        self.controller = server.controller

    async def _job(self, name: str, context: Context) -> JobRecord:
        job = self.controller.find(name) if name else None
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"job {name!r} not found")
            raise AssertionError  # abort raises
        return job

    async def SubmitJob(
        self, request: arranger_pb2.SubmitJobRequest, context: Context
    ) -> arranger_pb2.SubmitJobResponse:
        try:
            spec = parse_job(request.job)
        except SpecInvalid as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise
        if self.controller.find(spec.name) is not None:
            await context.abort(
                grpc.StatusCode.ALREADY_EXISTS,
                f"metadata.name: a job named {spec.name!r} exists; delete it or pick another name",
            )
        try:
            job = await self.server.submit(spec)
        except StoreError as exc:
            log.error("submit not stored", job=spec.name, error=str(exc))
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"the job was not stored: {exc}")
            raise
        return arranger_pb2.SubmitJobResponse(job=job_to_proto(job))

    async def GetJob(self, request: arranger_pb2.GetJobRequest, context: Context) -> job_pb2.TYJob:
        return job_to_proto(await self._job(request.name, context))

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
        jobs = sorted(
            (
                j
                for j in self.controller.jobs.values()
                if not j.deleted
                and (not request.queue or j.spec.queue == request.queue)
                and (not stages or j.stage.value in stages)
            ),
            key=lambda j: (j.submit_time, j.id),
        )
        start = 0
        if request.page_token:
            after = request.page_token
            start = next((i + 1 for i, j in enumerate(jobs) if _token(j) == after), len(jobs))
        page = jobs[start : start + size]
        reply = arranger_pb2.ListJobsResponse(jobs=[job_to_proto(j) for j in page])
        if start + size < len(jobs):
            reply.next_page_token = _token(page[-1])
        return reply

    async def WatchJobs(
        self, request: arranger_pb2.WatchJobsRequest, context: Context
    ) -> AsyncIterator[arranger_pb2.WatchJobsResponse]:
        sub = self.server.watch.subscribe(request.name)
        try:
            if request.name:
                job = await self._job(request.name, context)
                yield arranger_pb2.WatchJobsResponse(type="ADDED", job=job_to_proto(job))
            else:
                for job in list(self.controller.jobs.values()):
                    if not job.deleted:
                        yield arranger_pb2.WatchJobsResponse(type="ADDED", job=job_to_proto(job))
            while True:
                msg = await sub.queue.get()
                if msg is None:
                    if sub.overflowed:
                        await context.abort(
                            grpc.StatusCode.RESOURCE_EXHAUSTED, "watcher fell too far behind"
                        )
                    return
                yield msg
        finally:
            self.server.watch.unsubscribe(sub)

    async def StopJob(
        self, request: arranger_pb2.StopJobRequest, context: Context
    ) -> job_pb2.TYJob:
        job = await self._job(request.name, context)
        await self.server.commit(self.controller.stop(job, self.server.clock()))
        return job_to_proto(job)

    async def DeleteJob(
        self, request: arranger_pb2.DeleteJobRequest, context: Context
    ) -> arranger_pb2.DeleteJobResponse:
        job = await self._job(request.name, context)
        await self.server.commit(self.controller.delete(job, self.server.clock()))
        return arranger_pb2.DeleteJobResponse()

    async def GetLogs(
        self, request: arranger_pb2.GetLogsRequest, context: Context
    ) -> AsyncIterator[arranger_pb2.LogChunk]:
        job = await self._job(request.job, context)
        pod = await self._pod(job, request.pod, context)
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
        offset = -request.tail_bytes if request.tail_bytes > 0 else 0
        wait_s = LOG_FOLLOW_WAIT_S if request.follow else 0.0
        try:
            while True:
                chunk = await link.read_log(pod.uid, attempt, offset, LOG_CHUNK_BYTES, wait_s)
                if chunk.error:
                    await context.abort(grpc.StatusCode.NOT_FOUND, chunk.error)
                if chunk.data:
                    yield arranger_pb2.LogChunk(data=chunk.data)
                offset = chunk.next_offset
                if chunk.ended or (not request.follow and not chunk.data):
                    return
        except AgentGone as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))

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
        by_node: dict[str, list[PodRecord]] = {}
        specs = {}
        for job in self.controller.jobs.values():
            specs[job.id] = job.spec
            for pod in job.pods.values():
                if pod.state.holds_resources:
                    by_node.setdefault(pod.node, []).append(pod)
        nodes = sorted(self.controller.nodes.values(), key=lambda n: n.name)
        return arranger_pb2.ListNodesResponse(
            nodes=[node_to_proto(n, by_node.get(n.name, []), specs) for n in nodes]
        )

    async def ListEvents(
        self, request: arranger_pb2.ListEventsRequest, context: Context
    ) -> arranger_pb2.ListEventsResponse:
        job_id = ""
        if request.job:
            job_id = (await self._job(request.job, context)).id
        limit = request.limit or 1000
        if not 0 < limit <= 100_000:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "limit: must be 1..100000")
        events = await self.server.store.events(job_id, limit)
        return arranger_pb2.ListEventsResponse(events=[event_to_proto(e) for e in events])


def _token(job: JobRecord) -> str:
    return f"{job.submit_time!r}/{job.id}"
