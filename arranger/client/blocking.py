"""blocking: Client, the blocking twin of AsyncClient (see sdk).

Client runs an AsyncClient on an event loop of its own thread, so the two always behave the
same; a call interrupted while it waits (Ctrl-C) is cancelled on that loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from arranger.client.aio import FINISHED, AsyncClient, When
from arranger.client.messages import JobLike
from arranger.client.podexec import ExecResult
from arranger.v1 import arranger_pb2, job_pb2, node_pb2

if TYPE_CHECKING:
    from arranger.client.package import Shipped

T = TypeVar("T")

# How often a caller waiting for a call wakes to run its signal handlers: a signal the kernel
# delivered to another thread (the loop's, gRPC's) is handled only when the main thread runs.
SIGNAL_CHECK_S = 0.2


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
        (Ctrl-C, whichever thread the signal reached), it cancels the call on the loop before
        the interruption goes on."""
        future = asyncio.run_coroutine_threadsafe(_awaited(coro), self._loop)
        try:
            while True:
                try:
                    return future.result(SIGNAL_CHECK_S)
                except TimeoutError:
                    if future.done():  # the call's own timeout
                        raise
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
        *,
        queue_anyway: bool = False,
    ) -> job_pb2.TYJob:
        return self._run(self._async.submit(job, working_dir, shipped, queue_anyway=queue_anyway))

    def submit_job(
        self,
        job: JobLike,
        working_dir: str | Path | None = None,
        shipped: Callable[[Shipped], None] | None = None,
        *,
        queue_anyway: bool = False,
    ) -> arranger_pb2.SubmitJobResponse:
        return self._run(
            self._async.submit_job(job, working_dir, shipped, queue_anyway=queue_anyway)
        )

    def get(self, name: str) -> job_pb2.TYJob:
        return self._run(self._async.get(name))

    def jobs(
        self,
        queue: str = "",
        stages: Iterable[str] = (),
        owner: str = "",
        mine: bool = False,
        *,
        fold: bool = False,
        experiment: str = "",
    ) -> list[job_pb2.JobSummary]:
        return self._run(
            self._async.jobs(queue, stages, owner, mine, fold=fold, experiment=experiment)
        )

    def jobs_and_experiments(
        self, queue: str = "", stages: Iterable[str] = (), owner: str = "", mine: bool = False
    ) -> tuple[list[job_pb2.JobSummary], list[job_pb2.ExperimentSummary]]:
        return self._run(self._async.jobs_and_experiments(queue, stages, owner, mine))

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

    def log_tail(
        self, job: str, pod: str, lines: int, within_s: float
    ) -> list[arranger_pb2.LogChunk]:
        """log_tail: the chunks holding the last `lines` lines of the pod's log (its newest
        attempt that has one), read within `within_s` (TimeoutError past it)."""

        async def read() -> list[arranger_pb2.LogChunk]:
            return [c async for c in self._async.log_chunks(job, pod, tail_lines=lines)]

        return self._run(asyncio.wait_for(read(), within_s))

    def exec(
        self,
        job: str,
        command: str | Sequence[str],
        *,
        pod: str = "",
        input: bytes | None = None,
    ) -> ExecResult:
        return self._run(self._async.exec(job, command, pod=pod, input=input))

    def exec_replies(
        self,
        job: str,
        command: str | Sequence[str],
        *,
        pod: str = "",
        tty: bool = False,
        stdin: AsyncIterable[bytes] | None = None,
        size: job_pb2.TerminalSize | None = None,
        resizes: AsyncIterable[job_pb2.TerminalSize] | None = None,
    ) -> Iterator[arranger_pb2.ExecReply]:
        """exec_replies yields what AsyncClient.exec_replies does; `stdin` and `resizes` are
        read on the client's own loop (an async generator made here is bound to a loop only
        once it is first read)."""
        return self._iterate(
            self._async.exec_replies(
                job, command, pod=pod, tty=tty, stdin=stdin, size=size, resizes=resizes
            )
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
        *,
        experiment: str = "",
    ) -> list[arranger_pb2.HistoryRecord]:
        return self._run(
            self._async.history(user, since, until, queue, name, experiment=experiment)
        )

    # Experiments.

    def get_experiment(self, name: str) -> job_pb2.Experiment:
        return self._run(self._async.get_experiment(name))

    def stop_experiment(self, name: str) -> job_pb2.ExperimentSummary:
        return self._run(self._async.stop_experiment(name))

    def delete_experiment(self, name: str) -> None:
        self._run(self._async.delete_experiment(name))

    def get_reports(self, name: str, keys: Iterable[str] = ()) -> list[arranger_pb2.JobReports]:
        return self._run(self._async.get_reports(name, keys))

    def report_values(
        self,
        job: str,
        points: Iterable[tuple[int, Mapping[str, float]]],
        notes: Mapping[str, str] | None = None,
    ) -> None:
        self._run(self._async.report_values(job, points, notes))

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
