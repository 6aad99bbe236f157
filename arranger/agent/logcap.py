"""logcap keeps each pod attempt's log within the agent's maxLogBytes by dropping its oldest part.

The pod writes its log itself (nothing of its output passes through the agent, so a pod
outlives the agent and is never slowed by it). The agent checks each running attempt's log
every CHECK_S and, when it holds more than the limit, frees everything before the newest
`max_bytes` (rounded down to whole filesystem blocks) in place, with
fallocate(FALLOC_FL_PUNCH_HOLE): the file keeps its size, so offsets stay valid and the pod's
O_APPEND writes go on undisturbed; the dropped part takes no disk and reads as zeros. Readers
start at the first byte kept, which is the file's first data (lseek SEEK_DATA), so how much
was dropped needs no record and survives an agent restart.

Between two checks a pod can get ahead of the limit by whatever it writes in CHECK_S: a pod
writing 1 GB/s has about a gigabyte more on disk for up to a second.

Where the filesystem cannot punch holes, the log is cut to nothing instead (ftruncate; the
O_APPEND writers go on at its new end) and the number of bytes cut is kept beside it in
`<attempt>.dropped`, so offsets still count every byte written. That drops all of the older
output, not only what is over the limit, and misses the few bytes a pod writes between the
size being read and the cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger("arranger.agent")

CHECK_S = 1.0
_PUNCH_HOLE, _KEEP_SIZE = 0x02, 0x01
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


@dataclass(frozen=True)
class Window:
    """Window: what a log holds, in offsets that count every byte the pod ever wrote. `base`
    bytes were cut off the file's start (0 where holes are punched); the bytes kept run from
    `first` (the count of bytes dropped) to `end`."""

    base: int
    first: int
    end: int


def cut_path(log: Path) -> Path:
    """cut_path: where the bytes cut off a log are counted, where holes cannot be punched."""
    return log.with_suffix(".dropped")


def window(log: Path, fd: int) -> Window:
    """window: the log's window, `fd` being the log open for reading."""
    base = 0
    with contextlib.suppress(FileNotFoundError, ValueError):
        base = int(cut_path(log).read_text())
    size = os.fstat(fd).st_size
    try:
        data = os.lseek(fd, 0, os.SEEK_DATA)
    except OSError as exc:  # ENXIO: no data at all (empty, or all of it dropped)
        if exc.errno != errno.ENXIO:
            raise
        data = size
    return Window(base, base + min(data, size), base + size)


def trim(log: Path, max_bytes: int) -> int:
    """trim drops the log's oldest bytes beyond its newest `max_bytes`; returns how many
    bytes of it have been dropped in all. Raises OSError when the log cannot be opened."""
    fd = os.open(log, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        before = window(log, fd)
        if max_bytes <= 0 or before.end - before.first <= max_bytes:
            return before.first
        st = os.fstat(fd)
        block = st.st_blksize or 4096
        cut = (st.st_size - max_bytes) // block * block
        if cut <= before.first - before.base:
            return before.first
        if _libc.fallocate(fd, _PUNCH_HOLE | _KEEP_SIZE, 0, cut) != 0:
            code = ctypes.get_errno()
            if code not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise OSError(code, os.strerror(code), str(log))
            _cut(log, fd, before.base)
        return window(log, fd).first
    finally:
        os.close(fd)


def _cut(log: Path, fd: int, base: int) -> None:
    """_cut empties the log, counting what it held in its cut file first."""
    size = os.fstat(fd).st_size
    count = cut_path(log)
    part = count.with_suffix(".part")
    part.write_text(str(base + size))
    part.replace(count)
    os.ftruncate(fd, 0)


async def keep_within(path: Path, max_bytes: int, ended: asyncio.Event, pod: str) -> None:
    """keep_within keeps pod `pod`'s log at `path` within `max_bytes` every CHECK_S while it
    runs, and once more when `ended` is set; it gives up (with a warning) where the log is
    gone or the filesystem refuses."""
    while True:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CHECK_S):
                await ended.wait()
        try:
            if os.stat(path).st_size > max_bytes:  # else nothing to drop
                trim(path, max_bytes)
        except OSError as exc:  # purged meanwhile, or a filesystem that refuses
            log.warning("cannot keep the log small", pod=pod, error=str(exc))
            return
        if ended.is_set():
            return
