"""store_health: whether the store takes writes, as the server last found, and its way back.

A write the store refuses (the disk full, the file locked or removed, the database gone)
makes the store unwritable: the server says so (gRPC health NOT_SERVING, the metric
`arranger_store_writable` 0), and, while nothing else writes, tries a small write of its own
every PROBE_S (an event, StoreWritable) until one is taken. Any write taken makes it
writable again. A store that must not be written any more (its file was replaced: see the
stores' `broken`) refuses every try, so the server stays NOT_SERVING until restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog

log = structlog.get_logger("arranger.server")

PROBE_S = 2.0


class StoreHealth:
    """StoreHealth follows the outcome of each write. `said(writable)` is awaited on each
    change; `probe()` is a write that proves the store takes writes again (it raises when
    refused). `failures` counts refused writes."""

    def __init__(
        self, said: Callable[[bool], Awaitable[None]], probe: Callable[[], Awaitable[None]]
    ) -> None:
        self._said, self._probe = said, probe
        self.writable = True
        self.failures = 0
        self._trying: asyncio.Task[None] | None = None

    async def refused(self, error: str) -> None:
        """refused: a write was refused."""
        self.failures += 1
        if not self.writable:
            return
        self.writable = False
        log.error("the store refuses writes: health is NOT_SERVING until it takes one", error=error)
        await self._said(False)
        if self._trying is None or self._trying.done():
            self._trying = asyncio.create_task(self._try_again(), name="store-probe")

    async def taken(self) -> None:
        """taken: a write was taken."""
        if self.writable:
            return
        self.writable = True
        log.info("the store takes writes again")
        await self._said(True)

    async def _try_again(self) -> None:
        while not self.writable:
            await asyncio.sleep(PROBE_S)
            with contextlib.suppress(Exception):  # refused again: counted by `refused`
                await self._probe()

    async def stop(self) -> None:
        if self._trying is not None:
            self._trying.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._trying
