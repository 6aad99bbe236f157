"""logtail finds where the last N lines of a pod's log begin, reading the log backwards chunk by
chunk through the agent's ordinary log reads (no new agent request), so that `logs --tail N`
never starts inside a line.

A line ends with a newline; a last line without one counts as a line, as `tail -n` counts it.
The reads stop at the oldest byte the agent still keeps: a log with fewer lines starts there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

# Read reads up to `max_bytes` at `offset` (negative: from the end) and returns the bytes and
# the absolute offset just after them.
Read = Callable[[int, int], Awaitable[tuple[bytes, int]]]


async def tail_offset(read: Read, lines: int, chunk_bytes: int) -> int:
    """tail_offset: the absolute offset where the last `lines` lines (lines >= 1) of the log
    begin, as the log stood at the first read; it reads at most the bytes of those lines plus
    one chunk."""
    data, end = await read(-chunk_bytes, chunk_bytes)
    start = end - len(data)
    # The newline that ends the last line belongs to it: the search starts before it.
    limit = len(data) - 1 if data.endswith(b"\n") else len(data)
    wanted = lines
    while True:
        found, wanted = _newlines_back(data, limit, wanted)
        if found is not None:
            return start + found + 1
        if start <= 0:
            return start
        older, older_end = await read(max(start - chunk_bytes, 0), min(chunk_bytes, start))
        older_start = older_end - len(older)
        if not older or older_start >= start:  # nothing older is kept
            return start
        data = older[: start - older_start]
        start, limit = older_start, len(data)


def _newlines_back(data: bytes, limit: int, wanted: int) -> tuple[int | None, int]:
    """_newlines_back: the index of the `wanted`-th newline before `limit`, counting back, and
    how many are still wanted when `data` holds fewer (the index None)."""
    while wanted > 0:
        at = data.rfind(b"\n", 0, limit)
        if at < 0:
            return None, wanted
        wanted -= 1
        if wanted == 0:
            return at, 0
        limit = at
    return None, wanted
