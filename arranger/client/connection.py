"""connection: a client's calls to arranger-server, made on whichever of several servers answers.

Several servers may share one store, of which one is active; a standby refuses every call,
UNAVAILABLE, before doing anything. A call that finds a server unreachable, or a standby, is
made again on the next, round and round until `timeout_s` (see Failover); the connection then
stays with the one that answered. A stream that fails before its first message moves on the
same way; one that breaks later raises, as with a single server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, TypeVar

import grpc

from arranger.client.address import default_server
from arranger.client.channel import ArrangerError, Failover, ca_of, make_channel
from arranger.v1 import arranger_pb2_grpc

if TYPE_CHECKING:
    from arranger.v1.arranger_pb2_grpc import ArrangerAsyncStub as Stub

T = TypeVar("T")


class Connection:
    """Connection is a client's channels to the servers `server` names (comma-separated:
    `head-a:50051,head-b:50051`), and which of them answered last; use `async with`."""

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

    async def __aenter__(self) -> Self:
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
