"""A pod's log keeps its newest maxLogBytes: a real pod writing far more runs on undisturbed while
the agent drops the oldest part in place; reading the log says how much was dropped and starts
at the first byte kept; an agent started again over the same directory goes on doing so for
the pod it adopts. Where holes cannot be punched, the log is cut and the count kept beside it."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
from pathlib import Path

import pytest

from arranger.agent import logcap
from arranger.agent.logs import Chunk, read_chunk
from arranger.agent.orders import LaunchOrder
from arranger.agent.runs import PodRun
from arranger.agent.supervisor import Supervisor
from arranger.states import PodState
from tests.conftest import Gate, eventually, script

LIMIT = 64 * 1024
LINE = 100  # bytes per line the pod writes: "NNNNNNNN " and padding
# Writes 1 MiB of numbered lines, waits at a gate, writes 1 MiB more, waits at a second gate.
WRITER = """
import socket, sys
def burst(start):
    for i in range(start, start + 10486):
        sys.stdout.write(f"{i:08d} " + "x" * 90 + "\\n")
    sys.stdout.flush()
def wait(port):
    socket.create_connection(("127.0.0.1", port)).recv(1)
burst(0)
wait(int(sys.argv[1]))
burst(10486)
wait(int(sys.argv[2]))
"""


def supervisor(data_dir: Path, ended: dict[str, PodRun]) -> Supervisor:
    def changed(run: PodRun) -> None:
        if run.ended.is_set():
            ended[run.uid] = run

    return Supervisor("n1", "127.0.0.1", data_dir, changed, max_log_bytes=LIMIT)


async def read_all(path: Path) -> tuple[bytes, int]:
    """read_all: every byte kept, read chunk by chunk from offset 0, and what was dropped."""
    data, offset, dropped = b"", 0, -1
    while True:
        chunk: Chunk = await read_chunk(path, offset, 1 << 20, 0, lambda: False)
        if dropped < 0:
            dropped = chunk.dropped_bytes
        data += chunk.data
        offset = chunk.next_offset
        if chunk.ended:
            return data, dropped


def assert_newest_lines(data: bytes, dropped: int, end: int) -> None:
    """The bytes kept are the newest, whole numbered lines after a first partial one."""
    assert dropped + len(data) == end and len(data) <= LIMIT + 2 * LINE
    lines = data.split(b"\n")[1:-1]  # the first may start mid-line
    numbers = [int(line.split()[0]) for line in lines]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    assert numbers[-1] == end // LINE - 1


async def test_a_pods_log_keeps_its_newest_bytes_while_it_runs_and_after_a_restart(
    tmp_path: Path,
) -> None:
    ended: dict[str, PodRun] = {}
    first = supervisor(tmp_path / "agent", ended)
    async with Gate() as more, Gate() as finish:
        command = [*script(tmp_path, "writer", WRITER), str(more.port), str(finish.port)]
        first.launch(LaunchOrder("j/p", 0, job_id="j", pod_name="p", command=tuple(command)))
        path = first.files.log_path("j/p", 0)

        async def dropped_past(count: int) -> int:
            chunk = await read_chunk(path, 0, 1, 0, lambda: True)
            return chunk.dropped_bytes if chunk.dropped_bytes > count else 0

        dropped = await eventually(lambda: dropped_past(0), 30, "the oldest output dropped")
        assert first.runs["j/p"].state == PodState.RUNNING, "the pod runs on"
        size = path.stat().st_size
        assert size == 10486 * LINE, "offsets stay valid: the file keeps its size"
        assert path.stat().st_blocks * 512 <= 2 * LIMIT, "the dropped part takes no disk"
        data, dropped = await read_all(path)
        assert_newest_lines(data, dropped, size)

        # The agent dies (its tasks end; the pod runs on) and another takes over its directory.
        for task in list(first._tasks):
            task.cancel()
        await asyncio.gather(*first._tasks, return_exceptions=True)
        second = supervisor(tmp_path / "agent", ended)
        assert [run.state for run in second.recover()] == [PodState.RUNNING]
        more.open()
        await eventually(lambda: dropped_past(size), 30, "the adopted pod's log dropped too")
        finish.open()
        run = await eventually(lambda: ended.get("j/p"), 30, "the pod to end")
        assert run.state == PodState.SUCCEEDED, run.reason
        data, dropped = await read_all(path)
        assert_newest_lines(data, dropped, 2 * 10486 * LINE)


async def test_where_holes_cannot_be_punched_the_log_is_cut_and_offsets_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(fd: int, mode: int, offset: int, length: int) -> int:
        ctypes.set_errno(errno.EOPNOTSUPP)
        return -1

    monkeypatch.setattr(logcap._libc, "fallocate", refuse)
    log = tmp_path / "0.log"
    writer = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(writer, b"a" * 100_000)
        assert logcap.trim(log, LIMIT) == 100_000
        os.write(writer, b"b" * 10)  # the writer goes on, at the new end
    finally:
        os.close(writer)
    chunk = await read_chunk(log, 0, 1 << 20, 0, lambda: False)
    assert (chunk.data, chunk.dropped_bytes, chunk.next_offset) == (b"b" * 10, 100_000, 100_010)
    tail = await read_chunk(log, -4, 1 << 20, 0, lambda: False)
    assert (tail.data, tail.next_offset) == (b"bbbb", 100_010)
