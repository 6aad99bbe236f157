"""api serves arranger.v1.Arranger, the client API: the calls on jobs (job_calls) and on the
cluster: packages, nodes, queues, events and history (see calls for what they share)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

import grpc

from arranger.identity import caller
from arranger.server.access import may_read_private
from arranger.server.calls import Context
from arranger.server.convert import node_to_proto
from arranger.server.exec_calls import ExecCalls
from arranger.server.experiment_calls import ExperimentCalls
from arranger.server.job_calls import JobCalls
from arranger.server.model import NodeRecord
from arranger.server.packages import PackageRefused
from arranger.server.queues import QueueInvalid, QueueRecord, parse_queue
from arranger.server.record_pages import list_events, list_history
from arranger.server.store import StoreError
from arranger.spec import DEFAULT_QUEUE
from arranger.v1 import arranger_pb2, arranger_pb2_grpc, node_pb2

T = TypeVar("T")


class ApiServicer(JobCalls, ExecCalls, ExperimentCalls, arranger_pb2_grpc.ArrangerServicer):
    """ApiServicer: every call of the client API (see the module)."""

    async def HasPackage(
        self, request: arranger_pb2.HasPackageRequest, context: Context
    ) -> arranger_pb2.HasPackageResponse:
        has = self.packages.has(request.sha256, self.clock())
        return await _package_call(has, context, "the store cannot answer")

    async def UploadPackage(
        self, request_iterator: AsyncIterator[arranger_pb2.UploadPackageRequest], context: Context
    ) -> arranger_pb2.UploadPackageResponse:
        upload = self.packages.upload(request_iterator, self.clock())
        return await _package_call(upload, context, "the package was not stored")

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
        return node_to_proto(node, [pod for _, pod in held], specs, self.clock())

    async def CordonNode(
        self, request: arranger_pb2.CordonNodeRequest, context: Context
    ) -> node_pb2.Node:
        await self._admin("cordon " + request.name, context)
        node = await self._node(request.name, context)
        await self._commit(context, self.controller.cordon(node.name, request.cordon, self.clock()))
        return self._node_reply(node)

    async def DrainNode(
        self, request: arranger_pb2.DrainNodeRequest, context: Context
    ) -> node_pb2.Node:
        await self._admin("drain " + request.name, context)
        node = await self._node(request.name, context)
        await self._commit(context, self.controller.drain(node.name, self.clock()))
        return self._node_reply(node)

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
        await self._commit(context, self.controller.put_queue(queue, self.clock()))
        return self._queue_reply(queue)

    async def UpdateQueue(
        self, request: arranger_pb2.UpdateQueueRequest, context: Context
    ) -> arranger_pb2.Queue:
        await self._admin("update queues", context)
        queue = await self._parsed_queue(request.queue, context)
        if self.view.queue(queue.name) is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"queue {queue.name!r} not found")
        await self._commit(context, self.controller.put_queue(queue, self.clock()))
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
        await self._commit(context, self.controller.delete_queue(name, self.clock()))
        return arranger_pb2.DeleteQueueResponse()

    async def ListEvents(
        self, request: arranger_pb2.ListEventsRequest, context: Context
    ) -> arranger_pb2.ListEventsResponse:
        job_id = ""
        if request.job:
            job_id = (await self._job(request.job, context)).id
        await self._may_list(context)
        await self.reads.written()  # events are read from the store: as memory shows them
        return await list_events(self.reads.store, job_id, request, context, self._private)

    def _private(self, job_id: str) -> bool:
        """_private: whether the caller may read the private values of the job with that id
        (an admin may read any; a job no longer kept is no user's)."""
        job = self.view.job(job_id)
        who = caller()
        return who.admin or (job is not None and may_read_private(who, job))

    async def ListHistory(
        self, request: arranger_pb2.ListHistoryRequest, context: Context
    ) -> arranger_pb2.ListHistoryResponse:
        await self._may_list(context)
        await self.reads.written()
        return await list_history(self.reads.store, request, context)


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
