"""tail_offset finds where the last N lines begin, whatever the chunk size, as `tail -n` would."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from arranger.server.logtail import Read, tail_offset


def reader(log: bytes, first_kept: int = 0) -> Read:
    """reader reads `log` as the agent does: a negative offset counts from the end; bytes before
    `first_kept` were dropped."""

    async def read(offset: int, size: int) -> tuple[bytes, int]:
        start = len(log) + offset if offset < 0 else offset
        start = min(max(start, first_kept), len(log))
        data = log[start : start + size]
        return data, start + len(data)

    return read


async def tail(log: bytes, lines: int, chunk: int, first_kept: int = 0) -> bytes:
    return log[await tail_offset(reader(log, first_kept), lines, chunk) :]


def expected(log: bytes, lines: int) -> bytes:
    """expected: the last `lines` lines as tail counts them (only a newline ends a line)."""
    return b"".join(re.findall(rb"[^\n]*\n|[^\n]+$", log)[-lines:])


async def test_lines_longer_than_a_chunk_are_never_cut() -> None:
    log = b"short\n" + b"x" * 1000 + b"\nlast line\n"
    assert await tail(log, 2, chunk=7) == b"x" * 1000 + b"\nlast line\n"
    assert await tail(log, 1, chunk=7) == b"last line\n"
    assert await tail(log, 5, chunk=7) == log


async def test_a_last_line_without_a_newline_counts() -> None:
    assert await tail(b"a\nb\nc", 2, chunk=3) == b"b\nc"
    assert await tail(b"", 3, chunk=3) == b""
    assert await tail(b"\n\n\n", 2, chunk=1) == b"\n\n"


async def test_a_log_whose_oldest_bytes_were_dropped_starts_at_the_oldest_kept() -> None:
    log = b"one\ntwo\nthree\n"
    assert await tail(log, 10, chunk=2, first_kept=5) == b"wo\nthree\n"


@given(
    st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")), max_size=30),
    st.booleans(),
    st.integers(1, 40),
    st.integers(1, 16),
)
async def test_it_agrees_with_counting_newlines(
    lines: list[bytes], unfinished: bool, n: int, chunk: int
) -> None:
    log = b"\n".join(lines) + (b"" if unfinished or not lines else b"\n")
    assert await tail(log, n, chunk) == expected(log, n)
