"""sdk is the Python client of arranger-server: AsyncClient for asyncio code, Client otherwise.

Both take a job as a TYJob message, a dict in the YAML's shape, or YAML text, and return typed
protobuf messages. Every server refusal becomes an ArrangerError with the gRPC code and the
server's one-line message. Client runs an AsyncClient on an event loop of its own thread, so
the two always behave the same.

    from arranger.client.sdk import Client
    with Client("127.0.0.1:50051") as c:
        job = c.submit(open("job.yaml").read())
        done = c.wait(job.metadata.name)
        print(done.status.stage)
        for job in c.jobs(mine=True):  # summaries: no spec, whatever its size
            print(job.name, job.progress.stage)
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from arranger.client.address import default_server
from arranger.client.channel import REPLY_LIMIT as REPLY_LIMIT  # noqa: PLC0414 (re-exported)
from arranger.client.channel import ArrangerError as ArrangerError  # noqa: PLC0414 (public here)
from arranger.client.channel import Failover, ca_of, make_channel
from arranger.client.messages import JobLike, as_job
from arranger.client.messages import progress_of as progress_of  # noqa: PLC0414 (public here)
from arranger.client.messages import queue_message as queue_message  # noqa: PLC0414
from arranger.v1 import arranger_pb2, arranger_pb2_grpc, job_pb2, node_pb2

if TYPE_CHECKING:
    from arranger.client.package import Shipped
    from arranger.v1.arranger_pb2_grpc import ArrangerAsyncStub as Stub

FINISHED = ("Succeeded", "Failed")
When = float | datetime | None  # unix seconds, or a datetime (naive: local time)
T = TypeVar("T")


class WatchExpired(ArrangerError):
    """WatchExpired: the server no longer holds the changes after a resume token (it keeps the
    recent ones, of its current run only); watch again without a token."""


class AsyncClient:
    """AsyncClient talks to arranger-server over gRPC; use `async with`.

    `server` may name several servers, comma-separated (`head-a:50051,head-b:50051`): those
    sharing one store, of which one is active. A call that finds a server unreachable, or a
    standby (which refuses every call, UNAVAILABLE, before doing anything), is made again on
    the next, round and round until `timeout_s`; the client then stays with the one that
    answered. A stream that fails before its first message moves on the same way; one that
    breaks later raises, as with a single server.
    """

    def __init__(
        self,
        server: str | None = None,
        timeout_s: float = 30.0,
        token: str | None = None,
        ca: str | Path | None = None,
    ) -> None:
        self.server = server or default_server()
        self.servers = [s.strip() for s in self.server.split(",") if s.strip()] or [self.server]
        self.timeout_s = timeout_s
        self.ca = ca_of(ca)
        self._channels = [make_channel(address, token, ca) for address in self.servers]
        self._stubs: list[Stub] = [arranger_pb2_grpc.ArrangerStub(c) for c in self._channels]
        self._current = 0  # the server that answered last

    @property
    def current(self) -> str:
        """current: the server this client talks to now."""
        return self.servers[self._current]

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()

    async def _call(self, call: Callable[[Stub], Awaitable[T]]) -> T:
        """_call makes the call on the current server, moving on while it is unavailable."""
        tries = Failover(len(self.servers), self.timeout_s)
        while True:
            try:
                return await call(self._stubs[self._current])
            except grpc.aio.AioRpcError as exc:
                if not await tries.again(exc):
                    raise ArrangerError.from_rpc(exc, self.current, self.ca) from None
                self._current = (self._current + 1) % len(self.servers)

    async def _page(self, call: Callable[[Stub], Awaitable[T]], following: bool) -> T:
        """_page makes the call for one page of a listing. A page after the first that the
        server refuses for the caller's pace (limits.listsPerSecond) is asked again after a
        pause, a few times: a listing under way is finished, a new one refused at once."""
        for pause_s in (0.1, 0.3, 1.0, 2.0, None) if following else (None,):
            try:
                return await self._call(call)
            except ArrangerError as exc:
                paced = exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED and (
                    exc.message.startswith("limits.listsPerSecond")
                )
                if not paced or pause_s is None:
                    raise
                await asyncio.sleep(pause_s)
        raise AssertionError("unreachable: the last try raises")

    async def _stream(self, call: Callable[[Stub], Any]) -> AsyncGenerator[Any, None]:
        tries = Failover(len(self.servers), self.timeout_s)
        while True:
            started = call(self._stubs[self._current])
            begun = False
            try:
                async for item in started:
                    begun = True
                    yield item
                return
            except grpc.aio.AioRpcError as exc:
                if begun or not await tries.again(exc):
                    raise ArrangerError.from_rpc(exc, self.current, self.ca) from None
                self._current = (self._current + 1) % len(self.servers)
            finally:
                started.cancel()

    # Jobs.

    async def submit(
        self,
        job: JobLike,
        working_dir: str | Path | None = None,
        shipped: Callable[[Shipped], None] | None = None,
    ) -> job_pb2.TYJob:
        """submit submits a job; with `working_dir` (or the job's spec.workingDir, relative to
        the current directory) that directory is packed and shipped first (see package), and
        `shipped` is told how."""
        return (await self.submit_job(job, working_dir, shipped)).job

    async def submit_job(
        self,
        job: JobLike,
        working_dir: str | Path | None = None,
        shipped: Callable[[Shipped], None] | None = None,
    ) -> arranger_pb2.SubmitJobResponse:
        """submit_job submits as `submit` does and returns the whole reply: the job, and the
        server's warnings of why it cannot run on the cluster as it is now."""
        msg = job_pb2.TYJob()
        msg.CopyFrom(as_job(job))
        directory = working_dir or msg.spec.working_dir or None
        msg.spec.ClearField("working_dir")
        if directory is None:
            return await self._submit(msg)
        from arranger.client.package import submit_shipping  # noqa: PLC0415 (tarfile, only here)

        return await submit_shipping(self, msg, directory, self._submit, shipped)

    async def _submit(self, job: job_pb2.TYJob) -> arranger_pb2.SubmitJobResponse:
        request = arranger_pb2.SubmitJobRequest(job=job)
        return await self._call(lambda stub: stub.SubmitJob(request, timeout=self.timeout_s))

    async def has_package(self, sha256: str) -> arranger_pb2.HasPackageResponse:
        request = arranger_pb2.HasPackageRequest(sha256=sha256)
        return await self._call(lambda stub: stub.HasPackage(request, timeout=self.timeout_s))

    async def upload_package(
        self, messages: Callable[[], AsyncGenerator[arranger_pb2.UploadPackageRequest, None]]
    ) -> arranger_pb2.UploadPackageResponse:
        """upload_package streams the messages `messages()` makes (made again on the next
        server, when one is unavailable)."""
        return await self._call(
            lambda stub: stub.UploadPackage(messages(), timeout=max(self.timeout_s, 600.0))
        )

    async def get(self, name: str) -> job_pb2.TYJob:
        return await self._call(
            lambda stub: stub.GetJob(arranger_pb2.GetJobRequest(name=name), timeout=self.timeout_s)
        )

    async def jobs(
        self, queue: str = "", stages: Iterable[str] = (), owner: str = "", mine: bool = False
    ) -> list[job_pb2.JobSummary]:
        """jobs lists job summaries, oldest first, every page: of one queue, in some stages,
        of one owner, or only the caller's (`mine`) when asked."""
        return [job async for job in self.iter_jobs(queue, stages, owner, mine)]

    async def jobs_to_watch(
        self, queue: str = "", stages: Iterable[str] = (), owner: str = "", mine: bool = False
    ) -> tuple[list[job_pb2.JobSummary], str]:
        """jobs_to_watch: what `jobs` lists, and the resume token of its first page: `watch`
        from it then sends every change since (Kubernetes' list-then-watch; for many jobs,
        much cheaper than the watch's own initial listing)."""
        pages = self._pages(queue, stages, owner, mine, 0)
        first = await anext(pages)
        found = list(first.jobs)
        async for page in pages:
            found.extend(page.jobs)
        return found, first.resume_token

    async def iter_jobs(
        self,
        queue: str = "",
        stages: Iterable[str] = (),
        owner: str = "",
        mine: bool = False,
        page_size: int = 0,
    ) -> AsyncGenerator[job_pb2.JobSummary, None]:
        """iter_jobs yields what `jobs` lists, one page (`page_size`, default the server's) at
        a time. Jobs submitted while it pages come at the end; none comes twice."""
        async for page in self._pages(queue, stages, owner, mine, page_size):
            for job in page.jobs:
                yield job

    async def _pages(
        self, queue: str, stages: Iterable[str], owner: str, mine: bool, page_size: int
    ) -> AsyncGenerator[arranger_pb2.ListJobsResponse, None]:
        request = arranger_pb2.ListJobsRequest(
            queue=queue,
            stages=list(stages),
            owner=owner,
            mine=mine,
            page_size=page_size,
        )
        while True:
            reply: arranger_pb2.ListJobsResponse = await self._call(
                lambda stub: stub.ListJobs(request, timeout=self.timeout_s)
            )
            yield reply
            request.page_token = token = reply.next_page_token
            if not token:
                return

    async def watch(
        self, name: str = "", resume_token: str = ""
    ) -> AsyncGenerator[arranger_pb2.WatchJobsResponse, None]:
        """watch yields an ADDED summary of the job (or of every job), SYNCED, then each change
        (see WatchJobsRequest); with the `resume_token` of a message it had yielded, it goes on
        right after that message. A token the server no longer honours raises WatchExpired:
        watch again without one."""
        request = arranger_pb2.WatchJobsRequest(name=name, resume_token=resume_token)
        async with contextlib.aclosing(
            self._stream(lambda stub: stub.WatchJobs(request))
        ) as stream:
            try:
                async for event in stream:
                    yield event
            except ArrangerError as exc:
                if exc.code == grpc.StatusCode.FAILED_PRECONDITION and resume_token:
                    raise WatchExpired(exc.code, exc.message) from None
                raise

    async def wait(
        self, name: str, stages: Iterable[str] = FINISHED, timeout_s: float | None = None
    ) -> job_pb2.TYJob:
        """wait returns the whole job (as `get` does) once its stage is one of `stages`
        (default: finished); the job may have moved on by the time it is read."""
        wanted = set(stages)

        async def first() -> job_pb2.TYJob:
            async with contextlib.aclosing(self.watch(name)) as events:
                async for event in events:
                    if event.type == "DELETED":
                        raise ArrangerError(grpc.StatusCode.NOT_FOUND, f"job {name!r} was deleted")
                    progress = progress_of(event)
                    if progress is not None and progress.stage in wanted:
                        return await self.get(event.id)
            raise ArrangerError(grpc.StatusCode.UNAVAILABLE, "the watch ended before the job did")

        async with asyncio.timeout(timeout_s):
            return await first()

    async def scale(self, name: str, worker_set: str, counts: int) -> job_pb2.TYJob:
        """scale sets how many workers of the set the job wants (within the set's
        [minCount, maxCounts]); returns the job as it is then."""
        request = arranger_pb2.ScaleJobRequest(name=name, worker_set=worker_set, counts=counts)
        return await self._call(lambda stub: stub.ScaleJob(request, timeout=self.timeout_s))

    async def confirm_checkpoint(self, name: str) -> job_pb2.TYJob:
        """confirm_checkpoint tells the server the job has saved what it needs, at any time:
        the server keeps when (status.checkpoint_time), and a notice of the whole job's
        eviction, if one runs, ends now (FAILED_PRECONDITION once the job has ended)."""
        request = arranger_pb2.ConfirmCheckpointRequest(name=name)
        return await self._call(
            lambda stub: stub.ConfirmCheckpoint(request, timeout=self.timeout_s)
        )

    async def stop(self, name: str) -> job_pb2.TYJob:
        return await self._call(
            lambda stub: stub.StopJob(
                arranger_pb2.StopJobRequest(name=name), timeout=self.timeout_s
            )
        )

    async def delete(self, name: str) -> None:
        await self._call(
            lambda stub: stub.DeleteJob(
                arranger_pb2.DeleteJobRequest(name=name), timeout=self.timeout_s
            )
        )

    async def logs(
        self,
        job: str,
        pod: str = "",
        attempt: int | None = None,
        follow: bool = False,
        tail_bytes: int = 0,
        tail_lines: int = 0,
    ) -> AsyncGenerator[bytes, None]:
        """logs yields a pod attempt's output (default: the leader's latest attempt), from
        `tail_lines` lines or `tail_bytes` bytes before its end when one is given."""
        async for chunk in self.log_chunks(job, pod, attempt, follow, tail_bytes, tail_lines):
            if chunk.data:
                yield chunk.data

    async def log_chunks(
        self,
        job: str,
        pod: str = "",
        attempt: int | None = None,
        follow: bool = False,
        tail_bytes: int = 0,
        tail_lines: int = 0,
    ) -> AsyncGenerator[arranger_pb2.LogChunk, None]:
        """log_chunks yields what `logs` does as the server sends it: chunks of output, and
        a chunk with `dropped_bytes` when the agent dropped the oldest part of the log."""
        request = arranger_pb2.GetLogsRequest(
            job=job,
            pod=pod,
            attempt=attempt,
            follow=follow,
            tail_bytes=tail_bytes,
            tail_lines=tail_lines,
        )
        async for chunk in self._stream(lambda stub: stub.GetLogs(request)):
            yield chunk

    async def explain(self, name: str) -> arranger_pb2.ExplainJobResponse:
        """explain says why the job is where it is (see ExplainJob)."""
        request = arranger_pb2.ExplainJobRequest(name=name)
        return await self._call(lambda stub: stub.ExplainJob(request, timeout=self.timeout_s))

    async def events(self, job: str = "", limit: int = 1000) -> list[arranger_pb2.Event]:
        """events: the newest `limit` events (of one job, when given), oldest first, read a
        page at a time (a server sends at most 1000 a page)."""
        request = arranger_pb2.ListEventsRequest(job=job, limit=limit)
        pages: list[list[arranger_pb2.Event]] = []  # newest page first
        while True:
            reply: arranger_pb2.ListEventsResponse = await self._page(
                lambda stub: stub.ListEvents(request, timeout=self.timeout_s), bool(pages)
            )
            pages.append(list(reply.events))
            got = sum(map(len, pages))
            if not reply.next_page_token or got >= limit:
                return [event for page in reversed(pages) for event in page]
            request.page_token, request.limit = reply.next_page_token, limit - got

    async def history(
        self,
        user: str = "",
        since: When = None,
        until: When = None,
        queue: str = "",
        name: str = "",
    ) -> list[arranger_pb2.HistoryRecord]:
        """history lists the records of finished jobs that ended in [since, until) (unix
        seconds or datetimes; None: unbounded), of one user, queue or name when given, oldest
        end first, every page. Records outlive their jobs (see ListHistory)."""
        return [r async for r in self.iter_history(user, since, until, queue, name)]

    async def iter_history(
        self,
        user: str = "",
        since: When = None,
        until: When = None,
        queue: str = "",
        name: str = "",
        page_size: int = 0,
    ) -> AsyncGenerator[arranger_pb2.HistoryRecord, None]:
        """iter_history yields what `history` lists, a page at a time."""
        request = arranger_pb2.ListHistoryRequest(
            user=user, queue=queue, name=name, page_size=page_size
        )
        for value, out in ((since, request.since), (until, request.until)):
            if value is not None:
                seconds = value.timestamp() if isinstance(value, datetime) else float(value)
                out.FromNanoseconds(int(seconds * 1e9))
        while True:
            reply: arranger_pb2.ListHistoryResponse = await self._page(
                lambda stub: stub.ListHistory(request, timeout=self.timeout_s),
                bool(request.page_token),
            )
            for record in reply.records:
                yield record
            if not reply.next_page_token:
                return
            request.page_token = reply.next_page_token

    # Nodes.

    async def nodes(self) -> list[node_pb2.Node]:
        reply: arranger_pb2.ListNodesResponse = await self._call(
            lambda stub: stub.ListNodes(arranger_pb2.ListNodesRequest(), timeout=self.timeout_s)
        )
        return list(reply.nodes)

    async def cordon(self, node: str, cordon: bool = True) -> node_pb2.Node:
        request = arranger_pb2.CordonNodeRequest(name=node, cordon=cordon)
        return await self._call(lambda stub: stub.CordonNode(request, timeout=self.timeout_s))

    async def drain(self, node: str) -> node_pb2.Node:
        return await self._call(
            lambda stub: stub.DrainNode(
                arranger_pb2.DrainNodeRequest(name=node), timeout=self.timeout_s
            )
        )

    # Queues.

    async def queues(self) -> list[arranger_pb2.Queue]:
        reply: arranger_pb2.ListQueuesResponse = await self._call(
            lambda stub: stub.ListQueues(arranger_pb2.ListQueuesRequest(), timeout=self.timeout_s)
        )
        return list(reply.queues)

    async def create_queue(self, queue: arranger_pb2.Queue) -> arranger_pb2.Queue:
        request = arranger_pb2.CreateQueueRequest(queue=queue)
        return await self._call(lambda stub: stub.CreateQueue(request, timeout=self.timeout_s))

    async def update_queue(self, queue: arranger_pb2.Queue) -> arranger_pb2.Queue:
        request = arranger_pb2.UpdateQueueRequest(queue=queue)
        return await self._call(lambda stub: stub.UpdateQueue(request, timeout=self.timeout_s))

    async def delete_queue(self, name: str) -> None:
        request = arranger_pb2.DeleteQueueRequest(name=name)
        await self._call(lambda stub: stub.DeleteQueue(request, timeout=self.timeout_s))


class Client:
    """Client is the blocking twin of AsyncClient (same methods, same results); use `with`."""

    def __init__(
        self,
        server: str | None = None,
        timeout_s: float = 30.0,
        token: str | None = None,
        ca: str | Path | None = None,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="arranger-client", daemon=True
        )
        self._thread.start()
        self._async = self._run(_make(server, timeout_s, token, ca))
        self.server = self._async.server

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._run(self._async.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def _run(self, coro: Awaitable[T]) -> T:
        """_run: what `coro` gives, run on the client's loop; interrupted while it waits
        (Ctrl-C), it cancels the call on the loop before the interruption goes on."""
        future = asyncio.run_coroutine_threadsafe(_awaited(coro), self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def _iterate(self, stream: AsyncGenerator[T, None]) -> Iterator[T]:
        """_iterate yields the stream's items. Interrupted while it waits for one (Ctrl-C), the
        wait is cancelled on the loop (see _run), and with it the step of the stream it waited
        on; the stream is closed once that step has unwound."""
        step: list[asyncio.Future[T]] = []  # the step under way, as the loop set it
        try:
            while True:
                try:
                    item = self._run(_next(stream, step))
                except StopAsyncIteration:
                    return
                yield item
        finally:
            if not self._loop.is_closed():
                self._run(_closed(stream, step))

    def submit(
        self,
        job: JobLike,
        working_dir: str | Path | None = None,
        shipped: Callable[[Shipped], None] | None = None,
    ) -> job_pb2.TYJob:
        return self._run(self._async.submit(job, working_dir, shipped))

    def submit_job(
        self,
        job: JobLike,
        working_dir: str | Path | None = None,
        shipped: Callable[[Shipped], None] | None = None,
    ) -> arranger_pb2.SubmitJobResponse:
        return self._run(self._async.submit_job(job, working_dir, shipped))

    def get(self, name: str) -> job_pb2.TYJob:
        return self._run(self._async.get(name))

    def jobs(
        self, queue: str = "", stages: Iterable[str] = (), owner: str = "", mine: bool = False
    ) -> list[job_pb2.JobSummary]:
        return self._run(self._async.jobs(queue, stages, owner, mine))

    def jobs_to_watch(
        self, queue: str = "", stages: Iterable[str] = (), owner: str = "", mine: bool = False
    ) -> tuple[list[job_pb2.JobSummary], str]:
        return self._run(self._async.jobs_to_watch(queue, stages, owner, mine))

    def watch(
        self, name: str = "", resume_token: str = ""
    ) -> Iterator[arranger_pb2.WatchJobsResponse]:
        return self._iterate(self._async.watch(name, resume_token))

    def wait(
        self, name: str, stages: Iterable[str] = FINISHED, timeout_s: float | None = None
    ) -> job_pb2.TYJob:
        return self._run(self._async.wait(name, stages, timeout_s))

    def scale(self, name: str, worker_set: str, counts: int) -> job_pb2.TYJob:
        return self._run(self._async.scale(name, worker_set, counts))

    def confirm_checkpoint(self, name: str) -> job_pb2.TYJob:
        return self._run(self._async.confirm_checkpoint(name))

    def stop(self, name: str) -> job_pb2.TYJob:
        return self._run(self._async.stop(name))

    def delete(self, name: str) -> None:
        self._run(self._async.delete(name))

    def logs(
        self,
        job: str,
        pod: str = "",
        attempt: int | None = None,
        follow: bool = False,
        tail_bytes: int = 0,
        tail_lines: int = 0,
    ) -> Iterator[bytes]:
        return self._iterate(self._async.logs(job, pod, attempt, follow, tail_bytes, tail_lines))

    def log_chunks(
        self,
        job: str,
        pod: str = "",
        attempt: int | None = None,
        follow: bool = False,
        tail_bytes: int = 0,
        tail_lines: int = 0,
    ) -> Iterator[arranger_pb2.LogChunk]:
        return self._iterate(
            self._async.log_chunks(job, pod, attempt, follow, tail_bytes, tail_lines)
        )

    def events(self, job: str = "", limit: int = 1000) -> list[arranger_pb2.Event]:
        return self._run(self._async.events(job, limit))

    def explain(self, name: str) -> arranger_pb2.ExplainJobResponse:
        return self._run(self._async.explain(name))

    def history(
        self,
        user: str = "",
        since: When = None,
        until: When = None,
        queue: str = "",
        name: str = "",
    ) -> list[arranger_pb2.HistoryRecord]:
        return self._run(self._async.history(user, since, until, queue, name))

    def nodes(self) -> list[node_pb2.Node]:
        return self._run(self._async.nodes())

    def cordon(self, node: str, cordon: bool = True) -> node_pb2.Node:
        return self._run(self._async.cordon(node, cordon))

    def drain(self, node: str) -> node_pb2.Node:
        return self._run(self._async.drain(node))

    def queues(self) -> list[arranger_pb2.Queue]:
        return self._run(self._async.queues())

    def create_queue(self, queue: arranger_pb2.Queue) -> arranger_pb2.Queue:
        return self._run(self._async.create_queue(queue))

    def update_queue(self, queue: arranger_pb2.Queue) -> arranger_pb2.Queue:
        return self._run(self._async.update_queue(queue))

    def delete_queue(self, name: str) -> None:
        self._run(self._async.delete_queue(name))


async def _make(
    server: str | None, timeout_s: float, token: str | None, ca: str | Path | None
) -> AsyncClient:
    return AsyncClient(server, timeout_s, token, ca)  # made on the loop that uses the channel


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


async def _next(stream: AsyncGenerator[T, None], step: list[asyncio.Future[T]]) -> T:
    """_next: the stream's next item, its step kept in `step` (as a task: cancelling this
    coroutine cancels it too)."""
    step[:] = [asyncio.ensure_future(anext(stream))]
    return await step[0]


async def _closed(stream: AsyncGenerator[Any, None], step: list[asyncio.Future[Any]]) -> None:
    """_closed closes the stream once its last step has ended (an async generator cannot be
    closed while a step of it runs), cancelling that step if it still runs."""
    for running in step:
        running.cancel()
        await asyncio.wait([running])
    await stream.aclose()
