"""process starts a pod's process in its own process group and waits for it without threads.

Waiting uses a pidfd (Linux >= 5.3) watched by the event loop; elsewhere a thread waits.
Exit codes follow the shell's convention: 128 + N for a process ended by signal N.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path


def spawn(
    argv: list[str], env: Mapping[str, str], cwd: Path, log_path: Path
) -> subprocess.Popen[bytes]:
    """spawn starts argv as the leader of a new session (so a new process group), with
    stdout and stderr appended to log_path and stdin from /dev/null. Raises OSError when the
    program cannot be started."""
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,
            close_fds=True,
        )


async def wait_exit(proc: subprocess.Popen[bytes]) -> int:
    """wait_exit returns the exit code once the process ends (reaping it)."""
    loop = asyncio.get_running_loop()
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return exit_code(await asyncio.to_thread(proc.wait))
    ended: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not ended.done():
            ended.set_result(None)

    loop.add_reader(pidfd, readable)
    try:
        if proc.poll() is None:
            await ended
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
    return exit_code(proc.wait())


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """signal_group sends sig to every process of the group; False if none is left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def group_alive(pgid: int) -> bool:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, 0)
        return True
    return False


def describe_exit(code: int) -> str:
    if code > 128 and code - 128 < signal.NSIG:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(code - 128).name}"
    return f"exit code {code}"
