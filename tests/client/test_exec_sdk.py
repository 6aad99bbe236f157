"""The SDK's exec over ExecPod, against a scripted stand-in for the server (no cluster): what
requests it sends and when, what it makes of the replies, and how a call fails."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING

import grpc
import pytest

from arranger.client.podexec import ExecRequests
from arranger.client.sdk import ArrangerError, AsyncClient, Client, ExecResult
from arranger.v1 import arranger_pb2, arranger_pb2_grpc, job_pb2

WAIT_S = 10.0  # how long a test waits for what must come soon

Abort = tuple[grpc.StatusCode, str]
if TYPE_CHECKING:
    Context = grpc.aio.ServicerContext[arranger_pb2.ExecRequest, arranger_pb2.ExecReply]


class Puppet:
    """Puppet plays the server's side of ExecPod as a test says: every request it receives is
    put on `received` (then None, once the client has stopped sending), and it sends what the
    test puts on `replies` (an Abort ends the call with that status, once the start is read,
    as the server's ExecPod refuses; None ends it well). `unread` aborts before that, as the
    server's interceptors refuse (a standby, a bad token)."""

    def __init__(self, unread: bool = False) -> None:
        self.received: asyncio.Queue[arranger_pb2.ExecRequest | None] = asyncio.Queue()
        self.replies: asyncio.Queue[arranger_pb2.ExecReply | Abort | None] = asyncio.Queue()
        self.calls = 0
        self.unread = unread
        self._read = asyncio.Event()

    async def handle(
        self, requests: AsyncIterator[arranger_pb2.ExecRequest], context: Context
    ) -> AsyncGenerator[arranger_pb2.ExecReply, None]:
        self.calls += 1

        async def read() -> None:
            async for request in requests:
                self._read.set()
                await self.received.put(request)
            await self.received.put(None)

        reader = asyncio.create_task(read())
        try:
            while (reply := await self.replies.get()) is not None:
                if isinstance(reply, tuple):
                    if not self.unread:
                        await self._read.wait()
                    await context.abort(*reply)
                else:
                    yield reply
        finally:
            reader.cancel()

    async def request(self) -> arranger_pb2.ExecRequest | None:
        """request: the next request the server received (None: the client stopped)."""
        async with asyncio.timeout(WAIT_S):
            return await self.received.get()

    async def requests_until_closed(self) -> list[arranger_pb2.ExecRequest]:
        """requests_until_closed: the requests received up to `input_closed`, that one too."""
        got: list[arranger_pb2.ExecRequest] = []
        while True:
            request = await self.request()
            assert request is not None, got
            got.append(request)
            if request.input_closed:
                return got

    def reply(self, *replies: arranger_pb2.ExecReply | Abort | None) -> None:
        for reply in replies:
            self.replies.put_nowait(reply)


class FakeArranger(arranger_pb2_grpc.ArrangerServicer):
    def __init__(self, puppet: Puppet) -> None:
        self.puppet = puppet

    async def ExecPod(
        self,
        request_iterator: AsyncIterator[arranger_pb2.ExecRequest],
        context: Context,
    ) -> AsyncGenerator[arranger_pb2.ExecReply, None]:
        async for reply in self.puppet.handle(request_iterator, context):  # gRPC wants a
            yield reply  # method that is itself an async generator


@contextlib.asynccontextmanager
async def serving(puppet: Puppet) -> AsyncIterator[str]:
    """serving: the address of a gRPC server on 127.0.0.1 whose ExecPod the puppet plays."""
    server = grpc.aio.server()
    arranger_pb2_grpc.add_ArrangerServicer_to_server(FakeArranger(puppet), server)  # type: ignore[abstract]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


def started(where: str = "pod p-leader of job j on node n1") -> arranger_pb2.ExecReply:
    return arranger_pb2.ExecReply(started=where)


def stdout(data: bytes) -> arranger_pb2.ExecReply:
    return arranger_pb2.ExecReply(stdout=data)


def stderr(data: bytes) -> arranger_pb2.ExecReply:
    return arranger_pb2.ExecReply(stderr=data)


def ended(exit_code: int, message: str = "") -> arranger_pb2.ExecReply:
    return arranger_pb2.ExecReply(ended=job_pb2.ExecEnded(exit_code=exit_code, message=message))


def inputs(requests: list[arranger_pb2.ExecRequest]) -> list[bytes]:
    return [r.input for r in requests if r.WhichOneof("body") == "input"]


async def test_exec_without_input_closes_it_once_it_runs_and_collects_the_output() -> None:
    puppet = Puppet()
    async with serving(puppet) as address, AsyncClient(address) as client:
        call = asyncio.create_task(client.exec("j", ["nvidia-smi", "-L"], pod="actors-0"))
        first = await puppet.request()
        assert first is not None
        assert first.start == arranger_pb2.ExecStart(
            job="j", pod="actors-0", command=["nvidia-smi", "-L"]
        )
        puppet.reply(started())
        second = await puppet.request()
        assert second is not None and second.input_closed
        puppet.reply(stdout(b"GPU 0"), stderr(b"warn"), stdout(b"\n"), ended(3), None)
        async with asyncio.timeout(WAIT_S):
            result = await call
    assert result == ExecResult(["nvidia-smi", "-L"], 3, b"GPU 0\n", b"warn")


async def test_input_is_sent_once_the_command_runs_in_requests_of_64_kib() -> None:
    data = bytes(range(256)) * 600  # 150 KiB
    puppet = Puppet()
    async with serving(puppet) as address, AsyncClient(address) as client:
        call = asyncio.create_task(client.exec("j", "cat", input=data))
        start = await puppet.request()
        assert start is not None and start.start.stdin and start.start.command == ["cat"]
        puppet.reply(started())
        received = await puppet.requests_until_closed()
        puppet.reply(stdout(b"".join(inputs(received))), ended(0), None)
        async with asyncio.timeout(WAIT_S):
            result = await call
    assert [len(chunk) for chunk in inputs(received)] == [65536, 65536, len(data) - 131072]
    assert received[-1].input_closed and result.stdout == data and result.exit_code == 0


async def test_a_standby_s_refusal_moves_on_before_any_input_is_read() -> None:
    standby, active = Puppet(unread=True), Puppet()
    standby.reply((grpc.StatusCode.UNAVAILABLE, "this server is a standby"))
    reads = 0

    async def typed() -> AsyncGenerator[bytes, None]:
        nonlocal reads
        for line in (b"one\n", b"two\n"):
            reads += 1
            yield line

    async with (
        serving(standby) as first,
        serving(active) as second,
        AsyncClient(f"{first},{second}") as client,
    ):
        replies = client.exec_replies("j", ["sh"], stdin=typed())
        reading = asyncio.create_task(anext(replies))
        start = await active.request()
        assert start is not None and start.start.command == ["sh"]
        assert reads == 0  # held until the command runs
        active.reply(started())
        received = await active.requests_until_closed()
        active.reply(ended(0), None)
        async with asyncio.timeout(WAIT_S):
            assert (await reading).started
            assert [r async for r in replies] == [ended(0)]
    assert standby.calls == 1 and inputs(received) == [b"one\n", b"two\n"]


async def test_resizes_follow_the_start_s_size_once_the_command_runs() -> None:
    puppet = Puppet()
    stopped = asyncio.Event()

    async def sizes() -> AsyncGenerator[job_pb2.TerminalSize, None]:
        try:
            yield job_pb2.TerminalSize(rows=30, cols=100)
            await asyncio.Event().wait()  # no more: the call's end stops it
        finally:
            stopped.set()

    async with serving(puppet) as address, AsyncClient(address) as client:
        replies = client.exec_replies(
            "j",
            ["bash"],
            tty=True,
            size=job_pb2.TerminalSize(rows=24, cols=80),
            resizes=sizes(),
        )
        reading = asyncio.create_task(anext(replies))
        start = await puppet.request()
        assert start is not None
        assert start.start.tty and start.start.size == job_pb2.TerminalSize(rows=24, cols=80)
        puppet.reply(started())
        closed, resize = await puppet.request(), await puppet.request()
        assert closed is not None and closed.input_closed
        assert resize is not None and resize.resize == job_pb2.TerminalSize(rows=30, cols=100)
        puppet.reply(stdout(b"$ "), ended(0), None)
        async with asyncio.timeout(WAIT_S):
            await reading
            assert [r async for r in replies] == [stdout(b"$ "), ended(0)]
            await stopped.wait()


async def test_closing_the_requests_ends_their_stream_and_stops_the_sources() -> None:
    """gRPC's task reading the requests would wait for the next one as long as the process
    lives: the call's end (its status come) does not cancel it."""
    stopped = asyncio.Event()

    async def sizes() -> AsyncGenerator[job_pb2.TerminalSize, None]:
        try:
            yield job_pb2.TerminalSize(rows=30, cols=100)
            await asyncio.Event().wait()
        finally:
            stopped.set()

    start = arranger_pb2.ExecStart(job="j", command=["top"], tty=True)
    requests = ExecRequests(start, None, sizes())
    stream = requests.stream()
    async with asyncio.timeout(WAIT_S):
        assert (await anext(stream)).start == start
        requests.begin()
        assert (await anext(stream)).input_closed
        assert (await anext(stream)).resize == job_pb2.TerminalSize(rows=30, cols=100)
        waiting = asyncio.create_task(anext(stream))
        await requests.close()
        with pytest.raises(StopAsyncIteration):
            await waiting
    assert stopped.is_set()


async def test_a_call_that_ends_without_ended_raises() -> None:
    puppet = Puppet()
    puppet.reply(started())
    async with serving(puppet) as address, AsyncClient(address) as client:
        call = asyncio.create_task(client.exec("j", ["true"]))
        await puppet.request()
        await puppet.request()  # input_closed: what the client sends is all sent
        puppet.reply(stdout(b"partial"), None)
        with pytest.raises(ArrangerError) as raised:
            async with asyncio.timeout(WAIT_S):
                await call
    assert raised.value.code == grpc.StatusCode.UNAVAILABLE
    assert "before the command ended" in raised.value.message


async def test_a_refusal_is_an_arranger_error_with_the_server_s_words() -> None:
    puppet = Puppet()
    puppet.reply((grpc.StatusCode.PERMISSION_DENIED, "a job's token may not run commands"))
    async with serving(puppet) as address, AsyncClient(address) as client:
        with pytest.raises(ArrangerError) as raised:
            await client.exec("j", ["true"])
    assert raised.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert raised.value.message == "a job's token may not run commands"


async def test_input_that_fails_ends_the_call_and_raises_its_error() -> None:
    puppet = Puppet()
    puppet.reply(started())

    async def broken() -> AsyncGenerator[bytes, None]:
        yield b"half"
        raise OSError("the terminal went away")

    async with serving(puppet) as address, AsyncClient(address) as client:
        with pytest.raises(OSError, match="the terminal went away"):
            async with asyncio.timeout(WAIT_S):
                async for _ in client.exec_replies("j", ["cat"], stdin=broken()):
                    pass
        start, half = await puppet.request(), await puppet.request()
    assert start is not None and half is not None and half.input == b"half"


async def test_the_blocking_client_runs_a_command_and_returns_its_result() -> None:
    puppet = Puppet()
    puppet.reply(started(), stdout(b"ok\n"), ended(-1, "the pod ended"), None)
    async with serving(puppet) as address:

        def run() -> ExecResult:
            with Client(address) as client:
                return client.exec("j", ["python", "-c", "pass"])

        async with asyncio.timeout(WAIT_S):
            result = await asyncio.to_thread(run)
    assert result == ExecResult(["python", "-c", "pass"], -1, b"ok\n", b"", "the pod ended")
