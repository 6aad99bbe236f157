"""shims: the two shims a pod may start under, as test parameters: the shell's (process.SHIM
and WATCH, where no C compiler is found) and the compiled one (shim.c), which is skipped, saying
why, where no compiler builds it."""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest

from arranger.agent import launcher

COMPILER = launcher.which("cc") or launcher.which("gcc")
COMPILED_SHIM = launcher.compiled(launcher.SHIM_SOURCE)  # test_shim fails if a compiler fails
SHIMS = [
    pytest.param(None, id="shell-shim"),
    pytest.param(
        COMPILED_SHIM,
        id="compiled-shim",
        marks=pytest.mark.skipif(
            COMPILED_SHIM is None, reason="shim.c is not built here (no C compiler, or it failed)"
        ),
    ),
]


def tools_with(shim: str | None) -> launcher.Tools:
    """tools_with: the agent's own interpreter and launcher, and the shim given (None: the
    shell's)."""
    return launcher.Tools(None, sys.executable, shim=shim)


def waiting_on(lock: Path, leader: int) -> set[int]:
    """waiting_on: the processes of `leader`'s tree (the shim's: its fence watch) blocked on a
    flock of `lock`, as /proc/locks lists them ("->" marks a waiter)."""
    try:
        tree = {leader, *(p.pid for p in psutil.Process(leader).children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()
    inode = str(lock.stat().st_ino)
    waiting = set()
    with open("/proc/locks") as locks:
        for line in locks:
            fields = line.split()
            if len(fields) > 6 and fields[1] == "->" and fields[6].rsplit(":", 1)[-1] == inode:
                waiting.add(int(fields[5]))
    return waiting & tree
