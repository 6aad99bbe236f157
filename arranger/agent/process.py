"""process starts a pod's process in its own process group and waits for it without threads.

A pod runs under a shim, `/bin/sh`, that waits for it and writes its exit code to a file, so
that the code survives the agent: an agent killed and started again finds the file (the pod
ended meanwhile) or the shim still running (it adopts it, by pid and start time). The shim
ignores nothing: its TERM/INT/HUP trap only delays it until the pod has ended. The pod's pid,
as reported, is the shim's, which leads the pod's process group.

Waiting uses a pidfd (Linux >= 5.3) watched by the event loop, for our children and for
adopted processes alike; elsewhere a thread waits (or polls, for a process not our child).
Exit codes follow the shell's convention: 128 + N for a process ended by signal N.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import psutil

from arranger.agent.config import PodUser

SHELL = "/bin/sh"
SETPRIV = "setpriv"  # util-linux: the shim starts the pod as the pod's user through it
# The shim runs as the agent's user. It joins the pod's cgroups (their cgroup.procs files in
# ARRANGER_CGROUP_PROCS), so the pod is charged from its first byte, then runs the pod (argv,
# through setpriv when the pod has a user of its own) with stdin from /dev/null, and writes the
# exit code to its own stdin: a file the agent opened in a directory only the agent can write,
# which the pod cannot reach. A trap (not an ignore, which exec would pass on to the pod) makes
# the shell outlive a TERM sent to the group long enough to record the code.
SHIM = (
    'for f in $ARRANGER_CGROUP_PROCS; do echo $$ > "$f" || exit 125; done; '
    "unset ARRANGER_CGROUP_PROCS; "
    'trap : TERM INT HUP; "$@" </dev/null; c=$?; echo "$c" >&0; exit "$c"'
)


def spawn(
    argv: list[str], env: Mapping[str, str], cwd: Path, log_path: Path, exit_file: Path,
    user: PodUser | None = None, cgroup_procs: Sequence[Path] = (),
) -> subprocess.Popen[bytes]:  # fmt: skip
    """spawn starts argv under the shim as the leader of a new session (so a new process
    group), with stdout and stderr appended to log_path and stdin from /dev/null, as `user`
    when given, in the cgroups whose cgroup.procs files are given; the shim writes the exit
    code to exit_file (created here, never through a symlink). Raises OSError when the program
    cannot be started."""
    program = argv[0] if argv else ""
    if os.sep in program:
        found: str | None = program if os.access(cwd / program, os.X_OK) else None
    else:
        found = shutil.which(program, path=env.get("PATH", os.defpath)) if program else None
    if found is None:
        raise FileNotFoundError(2, "No such file or directory", program)
    # The program by its path: the shell must not take `echo` or `test` for its builtins.
    command = [found, *argv[1:]]
    if user is not None:
        groups = ",".join(map(str, user.groups)) or "-"
        command = [SETPRIV, f"--reuid={user.uid}", f"--regid={user.gid}",
                   f"--groups={groups}", "--", *command]  # fmt: skip
    exit_fd = open_private(exit_file)
    try:
        with open(log_path, "ab") as log_file:
            return subprocess.Popen(
                [SHELL, "-c", SHIM, "arranger-shim", *command],
                stdin=exit_fd,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env={**env, "ARRANGER_CGROUP_PROCS": " ".join(map(str, cgroup_procs))},
                start_new_session=True,
                close_fds=True,
            )
    finally:
        os.close(exit_fd)


def open_private(path: Path) -> int:
    """open_private: a descriptor for writing `path` afresh, readable by its owner only,
    never through a symlink (for the files the agent keeps where pods cannot write)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, 0o600)


async def wait_exit(proc: subprocess.Popen[bytes]) -> int:
    """wait_exit returns the exit code once the process ends (reaping it)."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return exit_code(await asyncio.to_thread(proc.wait))
    await _ended(pidfd, lambda: proc.poll() is not None)
    return exit_code(proc.wait())


def recorded_exit(exit_file: Path) -> int | None:
    """recorded_exit: the exit code the shim wrote, or None if it wrote none."""
    try:
        return int(exit_file.read_text().strip())
    except (OSError, ValueError):
        return None


def started_at(pid: int) -> float | None:
    """started_at: when the process started (psutil's create_time), None if it is gone."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


async def wait_gone(pid: int) -> None:
    """wait_gone returns once a process that is not our child has ended."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):
        with contextlib.suppress(psutil.Error):
            await asyncio.to_thread(psutil.Process(pid).wait)  # psutil polls for non-children
        return
    await _ended(pidfd, lambda: False)


async def _ended(pidfd: int, already: Callable[[], bool]) -> None:
    """_ended waits until the pidfd says its process ended (unless `already` says so after
    the watch is set up), then closes it."""
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not ended.done():
            ended.set_result(None)

    loop.add_reader(pidfd, readable)
    try:
        if not already():
            await ended
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)


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
