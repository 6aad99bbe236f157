"""podexec: a command run in a running pod over ExecPod, as `kubectl exec` runs one (see aio).

The call's first request says what to run; its input (or, without input, `input_closed`
alone) and the terminal's new sizes follow only once the server has replied that the command
runs (`started`). So a try that fails before then (moved on to the next server, see
connection) has read none of them, and a refusal is never written over: grpcio's asyncio
client reports a write that fails as the server ends the call as INTERNAL "Internal error
from Core" in place of the server's status (grpc/grpc#36066). The request stream stays open
until the call ends: a client that stopped sending is not a client that left.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterable, Sequence
from dataclasses import dataclass

from arranger.v1 import arranger_pb2, job_pb2

INPUT_LIMIT_BYTES = 64 * 2**10  # the most input one request carries (ExecRequest.input)
QUEUED_REQUESTS = 4  # input read ahead of what gRPC has sent: reading waits beyond it

Queued = arranger_pb2.ExecRequest | BaseException | None  # None: the call ended


@dataclass(frozen=True)
class ExecResult:
    """ExecResult is how a command run in a pod ended, as subprocess.CompletedProcess says:
    `exit_code` is 128 + N for signal N, and -1 when it never ran or no code is known, with
    `message` saying why."""

    command: list[str]
    exit_code: int
    stdout: bytes
    stderr: bytes
    message: str = ""


def exec_start(
    job: str,
    command: str | Sequence[str],
    pod: str,
    tty: bool,
    stdin: bool,
    size: job_pb2.TerminalSize | None,
) -> arranger_pb2.ExecStart:
    """exec_start: the first request's body."""
    start = arranger_pb2.ExecStart(
        job=job, pod=pod, command=words_of(command), tty=tty, stdin=stdin
    )
    if size is not None:
        start.size.CopyFrom(size)
    return start


def words_of(command: str | Sequence[str]) -> list[str]:
    """words_of: the command's words; a str is one word (a program without arguments), as
    subprocess takes it, never split into its letters."""
    return [command] if isinstance(command, str) else list(command)


async def given(data: bytes) -> AsyncGenerator[bytes, None]:
    """given yields `data`, input known in advance."""
    yield data


class ExecRequests:
    """ExecRequests makes the request stream of each try of one ExecPod call: the start, then,
    once `begin` says the command runs, the input (`stdin`, split into requests of at most
    INPUT_LIMIT_BYTES; then `input_closed`) and the terminal's sizes (`resizes`), until
    `close`.

    A source that fails ends the call: the stream raises its error, which gRPC answers by
    cancelling the call, and `error` keeps it for the caller to raise instead."""

    def __init__(
        self,
        start: arranger_pb2.ExecStart,
        stdin: AsyncIterable[bytes] | None,
        resizes: AsyncIterable[job_pb2.TerminalSize] | None,
    ) -> None:
        self._start = start
        self._stdin = stdin
        self._resizes = resizes
        self._queue: asyncio.Queue[Queued] = asyncio.Queue(QUEUED_REQUESTS)
        self._senders: list[asyncio.Task[None]] = []
        self._begun = False
        self.error: Exception | None = None

    def stream(self) -> AsyncGenerator[arranger_pb2.ExecRequest, None]:
        """stream: the requests of a new try of the call, on a queue of its own. The earlier
        try's stream ends (gRPC's task reading it would otherwise wait for its next request
        as long as the process lives: a call the server ended does not stop it)."""
        _end(self._queue)
        self._queue = asyncio.Queue(QUEUED_REQUESTS)
        return self._requests(self._queue)

    async def _requests(
        self, queue: asyncio.Queue[Queued]
    ) -> AsyncGenerator[arranger_pb2.ExecRequest, None]:
        yield arranger_pb2.ExecRequest(start=self._start)
        while (request := await queue.get()) is not None:
            if isinstance(request, BaseException):
                raise request
            yield request

    def begin(self) -> None:
        """begin starts sending the input and the sizes, once: the command runs."""
        if self._begun:
            return
        self._begun, queue = True, self._queue
        if self._stdin is None:
            queue.put_nowait(arranger_pb2.ExecRequest(input_closed=True))  # the first: room
        else:
            self._senders.append(asyncio.create_task(self._send_input(self._stdin, queue)))
        if self._resizes is not None:
            self._senders.append(asyncio.create_task(self._send_sizes(self._resizes, queue)))

    async def _send_input(self, stdin: AsyncIterable[bytes], queue: asyncio.Queue[Queued]) -> None:
        try:
            async for data in stdin:
                for at in range(0, len(data), INPUT_LIMIT_BYTES):
                    chunk = data[at : at + INPUT_LIMIT_BYTES]
                    await queue.put(arranger_pb2.ExecRequest(input=chunk))
        except Exception as exc:
            await self._fail(exc, queue)
            return
        await queue.put(arranger_pb2.ExecRequest(input_closed=True))

    async def _send_sizes(
        self, resizes: AsyncIterable[job_pb2.TerminalSize], queue: asyncio.Queue[Queued]
    ) -> None:
        try:
            async for size in resizes:
                await queue.put(arranger_pb2.ExecRequest(resize=size))
        except Exception as exc:
            await self._fail(exc, queue)

    async def _fail(self, exc: Exception, queue: asyncio.Queue[Queued]) -> None:
        if self.error is None:
            self.error = exc
        await queue.put(exc)

    async def close(self) -> None:
        """close stops the senders and ends the request stream (see `stream`)."""
        for sender in self._senders:
            sender.cancel()  # from here on, none of them puts anything
        _end(self._queue)
        if self._senders:
            await asyncio.wait(self._senders)


def _end(queue: asyncio.Queue[Queued]) -> None:
    """_end ends the stream that reads `queue`, dropping what it has not sent (no one puts
    more: the last put cannot wait)."""
    while not queue.empty():
        queue.get_nowait()
    queue.put_nowait(None)
