"""logs reads pod attempts' log files for the server, one bounded chunk per request.

The server pulls: it asks for a chunk, forwards it to its client, then asks for the next from
`next_offset`. So a slow reader never makes the agent or the server hold more than one chunk,
and a huge log never blocks the agent's stream.

Offsets count every byte the pod wrote; where the agent dropped a log's oldest part (see
logcap), a read starts at the first byte kept, and every chunk says how many were dropped.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from arranger.agent.logcap import window

MAX_CHUNK_BYTES = 1024 * 1024
POLL_S = 0.1


@dataclass(frozen=True)
class Chunk:
    """Chunk: bytes of a log from some offset; `dropped_bytes` of its oldest output are gone."""

    data: bytes
    next_offset: int
    ended: bool
    dropped_bytes: int = 0


def _read(path: Path, offset: int, max_bytes: int) -> tuple[bytes, int, int]:
    """_read: the bytes at `offset` (negative: from the end), where the next read starts, and
    how many bytes were dropped."""
    with open(path, "rb") as f:
        fd = f.fileno()
        kept = window(path, fd)
        start = kept.end + offset if offset < 0 else offset
        start = min(max(start, kept.first), kept.end)
        data = os.pread(fd, max(0, min(max_bytes, MAX_CHUNK_BYTES)), start - kept.base)
        after = window(path, fd)  # a hole punched meanwhile reads as zeros: leave those out
        if after.base != kept.base:  # cut meanwhile (no holes here): what was read is gone
            return b"", after.first, after.first
        if after.first > start:
            data = data[after.first - start :]
            start = after.first
    return data, start + len(data), after.first


async def read_chunk(
    path: Path, offset: int, max_bytes: int, wait_s: float, running: Callable[[], bool]
) -> Chunk:
    """read_chunk returns the bytes at `offset` (negative: from the end). With wait_s > 0 and
    nothing to read yet, it waits while the attempt runs. `ended` says the attempt is over and
    the chunk reaches the end of its log. Raises FileNotFoundError when there is no such log
    and the attempt is not about to write it."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = running()  # asked before reading, so nothing written after it is missed
        try:
            data, next_offset, dropped = _read(path, offset, max_bytes)
        except FileNotFoundError:
            # The launch order may still be on its way: the file comes with the process.
            if time.monotonic() >= deadline:
                if not alive:
                    raise
                return Chunk(b"", max(offset, 0), ended=False)
            await asyncio.sleep(POLL_S)
            continue
        if data:
            return Chunk(data, next_offset, ended=False, dropped_bytes=dropped)
        if not alive:
            return Chunk(b"", next_offset, ended=True, dropped_bytes=dropped)
        if time.monotonic() >= deadline:
            return Chunk(b"", next_offset, ended=False, dropped_bytes=dropped)
        await asyncio.sleep(POLL_S)
