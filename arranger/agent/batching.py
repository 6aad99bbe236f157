"""batching gathers what callers ask for within one turn of the event loop into one call.

A crowd of podman commands serialises on podman's own locks; one `rm` or `inspect` of many
containers costs little more than of one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class TurnBatch(Generic[T]):
    """TurnBatch gathers the container names asked for within one turn of the event loop into
    one podman call (`run(names)` maps each name to its result)."""

    def __init__(self, run: Callable[[list[str]], Awaitable[Mapping[str, T | None]]]) -> None:
        self._run = run
        self._waiting: dict[str, list[asyncio.Future[T | None]]] = {}
        self._scheduled = False
        self._flushes: set[asyncio.Task[None]] = set()

    async def call(self, name: str) -> T | None:
        future: asyncio.Future[T | None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(name, []).append(future)
        if not self._scheduled:  # after the callers of this turn have asked
            self._scheduled = True
            flush = asyncio.create_task(self._flush())
            self._flushes.add(flush)
            flush.add_done_callback(self._flushes.discard)
        return await future

    async def _flush(self) -> None:
        self._scheduled = False
        waiting, self._waiting = self._waiting, {}
        names = list(waiting)
        try:
            results = await self._run(names)
        except Exception as exc:  # each caller gets it
            for futures in waiting.values():
                for f in futures:
                    if not f.done():
                        f.set_exception(exc)
            return
        for name, futures in waiting.items():
            for f in futures:
                if not f.done():
                    f.set_result(results.get(name))
