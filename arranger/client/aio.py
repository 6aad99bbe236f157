"""aio: AsyncClient, arranger-server's calls for asyncio code (see sdk).

It takes a job as a TYJob message, a dict in the YAML's shape, or YAML text, and returns typed
protobuf messages. Every server refusal becomes an ArrangerError with the gRPC code and the
server's one-line message.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from arranger.client.channel import ArrangerError
from arranger.client.experiment_calls import ExperimentCalls
from arranger.client.messages import JobLike, as_job, progress_of
from arranger.client.podexec import ExecRequests, ExecResult, exec_start, given, words_of
from arranger.v1 import arranger_pb2, job_pb2, node_pb2

if TYPE_CHECKING:
    from arranger.client.package import Shipped

FINISHED = ("Succeeded", "Failed")
When = float | datetime | None  # unix seconds, or a datetime (naive: local time)


class WatchExpired(ArrangerError):
    """WatchExpired: the server no longer holds the changes after a resume token (it keeps the
    recent ones, of its current run only); watch again without a token."""


class AsyncClient(ExperimentCalls):
    """AsyncClient talks to arranger-server over gRPC; use `async with`.

    `server` may name several servers, comma-separated (`head-a:50051,head-b:50051`): those
    sharing one store, of which one is active. Each call goes to the one that answers (see
    connection). The calls for experiments are ExperimentCalls'.
    """

    # Jobs.

    async def submit(
        self,
        job: JobLike,
        working_dir: str | Path | None = None,
        shipped: Callable[[Shipped], None] | None = None,
        *,
        queue_anyway: bool = False,
    ) -> job_pb2.TYJob:
        """submit submits a job; with `working_dir` (or the job's spec.workingDir, relative to
        the current directory) that directory is packed and shipped first (see package), and
        `shipped` is told how. `queue_anyway`: queue a job no registered node could ever hold
        (the server refuses it otherwise)."""
        return (await self.submit_job(job, working_dir, shipped, queue_anyway=queue_anyway)).job

    async def submit_job(
        self,
        job: JobLike,
        working_dir: str | Path | None = None,
        shipped: Callable[[Shipped], None] | None = None,
        *,
        queue_anyway: bool = False,
    ) -> arranger_pb2.SubmitJobResponse:
        """submit_job submits as `submit` does and returns the whole reply: the job, and the
        server's warnings of why it cannot run on the cluster as it is now."""
        msg = job_pb2.TYJob()
        msg.CopyFrom(as_job(job))
        directory = working_dir or msg.spec.working_dir or None
        msg.spec.ClearField("working_dir")
        if directory is None:
            return await self._submit(msg, queue_anyway)
        from arranger.client.package import submit_shipping  # noqa: PLC0415 (tarfile, only here)

        def send(job: job_pb2.TYJob) -> Awaitable[arranger_pb2.SubmitJobResponse]:
            return self._submit(job, queue_anyway)

        return await submit_shipping(self, msg, directory, send, shipped)

    async def _submit(
        self, job: job_pb2.TYJob, queue_anyway: bool = False
    ) -> arranger_pb2.SubmitJobResponse:
        request = arranger_pb2.SubmitJobRequest(job=job)
        if queue_anyway:  # set only when asked: a server of the previous release never sees it
            request.queue_anyway = True
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
        self,
        queue: str = "",
        stages: Iterable[str] = (),
        owner: str = "",
        mine: bool = False,
        *,
        fold: bool = False,
        experiment: str = "",
    ) -> list[job_pb2.JobSummary]:
        """jobs lists job summaries, oldest first, every page: of one queue, in some stages,
        of one owner, or only the caller's (`mine`) when asked; with `fold`, none that is an
        experiment's member (jobs_and_experiments lists the experiments too); with
        `experiment` (a name or id), only that experiment's members."""
        return [
            job
            async for job in self.iter_jobs(
                queue, stages, owner, mine, fold=fold, experiment=experiment
            )
        ]

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
        *,
        fold: bool = False,
        experiment: str = "",
    ) -> AsyncGenerator[job_pb2.JobSummary, None]:
        """iter_jobs yields what `jobs` lists, one page (`page_size`, default the server's) at
        a time. Jobs submitted while it pages come at the end; none comes twice."""
        pages = self._pages(queue, stages, owner, mine, page_size, fold=fold, experiment=experiment)
        async for page in pages:
            for job in page.jobs:
                yield job

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
        a chunk with `dropped_bytes` when the agent dropped the oldest part of the log. With
        no `attempt` named, a first chunk without data says which it shows (`attempt`, the
        newest that has a log, `latest_attempt` and `pod`)."""
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

    async def exec(
        self,
        job: str,
        command: str | Sequence[str],
        *,
        pod: str = "",
        input: bytes | None = None,
    ) -> ExecResult:
        """exec runs `command` in a running pod of the job (default: the leader) as
        subprocess.run does, with `input` as its standard input (none: empty), and returns
        how it ended and all it wrote (see exec_replies)."""
        stdin = None if input is None else given(input)
        out, err = bytearray(), bytearray()
        async for reply in self.exec_replies(job, command, pod=pod, stdin=stdin):
            if reply.HasField("stdout"):
                out += reply.stdout
            elif reply.HasField("stderr"):
                err += reply.stderr
            elif reply.HasField("ended"):
                ended = reply.ended
                return ExecResult(
                    words_of(command), ended.exit_code, bytes(out), bytes(err), ended.message
                )
        raise AssertionError("unreachable: exec_replies ends with `ended` or raises")

    async def exec_replies(
        self,
        job: str,
        command: str | Sequence[str],
        *,
        pod: str = "",
        tty: bool = False,
        stdin: AsyncIterable[bytes] | None = None,
        size: job_pb2.TerminalSize | None = None,
        resizes: AsyncIterable[job_pb2.TerminalSize] | None = None,
    ) -> AsyncGenerator[arranger_pb2.ExecReply, None]:
        """exec_replies runs `command` in a running pod of the job (default: the leader), as
        `kubectl exec` does, and yields the server's replies: `started` (where it runs), its
        output (`stdout`, `stderr`; on a terminal, stdout alone), then `ended`, the last.
        `stdin` is its input, read once it runs and sent in requests of at most 64 KiB; its
        end closes the input (without it the command's input is empty). With `tty` it runs
        on a terminal of `size`, resized to each size `resizes` yields. A call that ends
        without `ended` raises ArrangerError; one whose `stdin` or `resizes` raises is
        cancelled (the command is ended) and raises that error. The job's owner or an
        admin may; a job's token may not."""
        start = exec_start(job, command, pod, tty, stdin is not None, size)
        requests = ExecRequests(start, stdin, resizes)
        try:
            async with contextlib.aclosing(
                self._stream(lambda stub: stub.ExecPod(requests.stream()))
            ) as replies:
                async for reply in replies:
                    if reply.HasField("started"):
                        requests.begin()
                    yield reply
                    if reply.HasField("ended"):
                        return
        except asyncio.CancelledError:
            if requests.error is None:
                raise
            raise requests.error from None  # gRPC cancelled the call the source broke
        finally:
            await requests.close()
        raise ArrangerError(
            grpc.StatusCode.UNAVAILABLE, "the server ended the call before the command ended"
        )

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
        *,
        experiment: str = "",
    ) -> list[arranger_pb2.HistoryRecord]:
        """history lists the records of finished jobs that ended in [since, until) (unix
        seconds or datetimes; None: unbounded), of one user, queue or name, or of the members
        of one experiment (its id, as get_experiment gives it) when given, oldest end first,
        every page. Records outlive their jobs (see ListHistory)."""
        return [
            r
            async for r in self.iter_history(user, since, until, queue, name, experiment=experiment)
        ]

    async def iter_history(
        self,
        user: str = "",
        since: When = None,
        until: When = None,
        queue: str = "",
        name: str = "",
        page_size: int = 0,
        *,
        experiment: str = "",
    ) -> AsyncGenerator[arranger_pb2.HistoryRecord, None]:
        """iter_history yields what `history` lists, a page at a time."""
        request = arranger_pb2.ListHistoryRequest(
            user=user, queue=queue, name=name, page_size=page_size, experiment=experiment
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
