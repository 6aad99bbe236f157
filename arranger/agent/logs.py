"""logs serves a pod attempt's log file to the server, optionally following it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

CHUNK_BYTES = 64 * 1024
FOLLOW_POLL_S = 0.2
LAUNCH_WAIT_S = 5.0


async def read_log(
    path: Path, tail_bytes: int, follow: bool, still_running: Callable[[], bool]
) -> AsyncIterator[bytes]:
    """read_log yields the file's bytes (the last tail_bytes when > 0); with follow it keeps
    yielding what is appended until still_running() turns false, then yields the rest.

    Reads are synchronous on purpose: at most 64 KiB of a local file, usually from the page
    cache, costs less than a hop to a thread.
    """
    try:
        f = open(path, "rb")  # noqa: SIM115, ASYNC230 (held open across awaits)
    except FileNotFoundError:
        if not follow:
            raise
        # The launch order may still be on its way: wait for the file while the pod may run.
        deadline = time.monotonic() + LAUNCH_WAIT_S
        while not path.exists():  # noqa: ASYNC240
            if not still_running() and time.monotonic() > deadline:
                raise
            await asyncio.sleep(FOLLOW_POLL_S)
        f = open(path, "rb")  # noqa: SIM115, ASYNC230
    with f:
        if tail_bytes > 0:
            size = f.seek(0, 2)
            f.seek(max(0, size - tail_bytes))
        while True:
            data = f.read(CHUNK_BYTES)
            if data:
                yield data
                continue
            if not follow:
                return
            if not still_running():
                rest = f.read()
                if rest:
                    yield rest
                return
            await asyncio.sleep(FOLLOW_POLL_S)
