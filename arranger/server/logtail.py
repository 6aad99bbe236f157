"""logtail reads a pod's log for GetLogs through its agent (`log_chunks`), and finds where the
last N lines of it begin (`tail_offset`), reading the log backwards chunk by chunk through the
agent's ordinary log reads (no new agent request), so that `logs --tail N` never starts inside
a line.

A line ends with a newline; a last line without one counts as a line, as `tail -n` counts it.
The reads stop at the oldest byte the agent still keeps: a log with fewer lines starts there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from arranger.server.agent_link import AgentGone, AgentLink
from arranger.v1 import arranger_pb2

LOG_CHUNK_BYTES = 1024 * 1024
LOG_FOLLOW_WAIT_S = 5.0  # how long the agent holds a follow read open waiting for output
LOOK_BACK = 8  # attempts newest_logged asks for, newest first

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


async def newest_logged(link: AgentLink, uid: str, latest: int) -> int:
    """newest_logged: the newest of a pod's attempts up to `latest` whose log its agent has,
    looking back at most LOOK_BACK attempts; `latest` when none of those has one (an attempt
    not yet started, or ended before its runtime wrote a byte, has none)."""
    for attempt in range(latest, max(latest - LOOK_BACK, -1), -1):
        chunk = await link.read_log(uid, attempt, 0, 0, 0.0)
        if not chunk.error:
            return attempt
    return latest


async def log_chunks(
    link: AgentLink,
    uid: str,
    attempt: int,
    request: arranger_pb2.GetLogsRequest,
    context: Any,
    pod_name: str = "",
) -> AsyncIterator[arranger_pb2.LogChunk]:
    """log_chunks: a pod attempt's log as GetLogs answers it, read through its agent: from its
    start, its last `tail_bytes` or the start of its last `tail_lines` lines; following it
    with `follow` until the attempt ended and all was read. Chunks that say how much the agent
    dropped come before the data that follows the gap. With `pod_name` (the request named no
    attempt) `attempt` is the pod's latest: the newest attempt that has a log is read instead,
    and a first chunk names it (see newest_logged)."""
    offset = -request.tail_bytes if request.tail_bytes > 0 else 0
    if pod_name:
        try:
            latest, attempt = attempt, await newest_logged(link, uid, attempt)
        except AgentGone as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            return
        yield arranger_pb2.LogChunk(attempt=attempt, latest_attempt=latest, pod=pod_name)
    wait_s = LOG_FOLLOW_WAIT_S if request.follow else 0.0
    dropped = 0

    async def read(at: int, size: int) -> tuple[bytes, int]:
        chunk = await link.read_log(uid, attempt, at, size, 0.0)
        if chunk.error:
            await context.abort(grpc.StatusCode.NOT_FOUND, chunk.error)
        return chunk.data, chunk.next_offset

    try:
        if request.tail_lines > 0:
            offset = await tail_offset(read, request.tail_lines, LOG_CHUNK_BYTES)
        while True:
            chunk = await link.read_log(uid, attempt, offset, LOG_CHUNK_BYTES, wait_s)
            if chunk.error:
                await context.abort(grpc.StatusCode.NOT_FOUND, chunk.error)
            if chunk.dropped_bytes > dropped:
                dropped = chunk.dropped_bytes
                yield arranger_pb2.LogChunk(dropped_bytes=dropped)
            if chunk.data:
                yield arranger_pb2.LogChunk(data=chunk.data)
            offset = chunk.next_offset
            if chunk.ended or (not request.follow and not chunk.data):
                return
    except AgentGone as exc:
        await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
