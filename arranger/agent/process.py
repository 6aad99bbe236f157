"""process starts a pod's process in its own process group and waits for it without threads.

A pod runs under a shim (the compiled one, shim.c, where the machine builds it; else `/bin/sh`
running SHIM) that waits for it and writes its exit code to a file, so that the code survives
the agent: an agent killed and started again finds the file (the pod
ended meanwhile) or the shim still running (it adopts it, by pid and start time). The shim
ignores nothing: its TERM/INT/HUP trap only delays it until the pod has ended. The pod's pid,
as reported, is the shim's, which leads the pod's process group.

The shim runs as the agent's user (root, on a shared node) and sees nothing of the pod: it
gets an environment of the agent's making and runs the launcher (see launcher), which becomes
the pod's user before it reads the pod's argv, environment and working directory.

Waiting uses a pidfd (Linux >= 5.3) watched by the event loop, for our children and for
adopted processes alike; elsewhere a thread waits (or polls, for a process not our child).
Exit codes follow the shell's convention: 128 + N for a process ended by signal N.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

import psutil

from arranger.agent import launcher
from arranger.agent.config import PodUser
from arranger.agent.fence import FenceFiles

# The shim joins the pod's cgroups (their cgroup.procs files in ARRANGER_CGROUP_PROCS), so the
# pod is charged from its first byte, then runs the launcher with stdin from /dev/null, and
# writes the exit code to its own stdin: a file the agent opened in a directory only the agent
# can write, which the pod cannot reach. A trap (not an ignore, which exec would pass on to the
# pod) makes the shell outlive a TERM sent to the group long enough to record the code.
#
# With ARRANGER_GATE_FD set, the shim first waits for a line on that descriptor (a pipe's read
# end; read through /proc, as sh takes only descriptors 0-9 in redirections): the agent writes
# it once the run is recorded. An agent that dies before that leaves the pipe without a writer,
# and the shim exits (125) without running anything, so the next agent, which cannot know the
# run, never finds a second copy of a pod it starts again. (The pod inherits the read end, of
# a pipe by then closed at the other.)
#
# With ARRANGER_AGENT_LOCK set, a watch (WATCH) runs beside the pod, in its process group,
# until the pod ends: it fences the pod when its agent is gone past the fence timeout. It is
# started before the shim joins the pod's cgroups, so the programs it runs in its loop (flock,
# date, sleep) are not the pod's to starve: a pod that fills its pids limit is fenced all the
# same. (The compiled shim's watch forks nothing.)
SHIM = (
    '[ -n "$ARRANGER_AGENT_LOCK" ] && { eval "$ARRANGER_WATCH" </dev/null & g=$!; }; '
    "unset ARRANGER_WATCH ARRANGER_AGENT_LOCK ARRANGER_SERVER_HEARD ARRANGER_FENCE_MARK; "
    'q() { [ -n "$g" ] && kill -USR1 "$g" 2>/dev/null; exit 125; }; '
    'for f in $ARRANGER_CGROUP_PROCS; do echo $$ > "$f" || q; done; '
    "unset ARRANGER_CGROUP_PROCS; trap : TERM INT HUP; "
    '[ -n "$ARRANGER_GATE_FD" ] && { read go < "/proc/self/fd/$ARRANGER_GATE_FD" || q; }; '
    "unset ARRANGER_GATE_FD; "
    '"$@" </dev/null; c=$?; echo "$c" >&0; '
    '[ -n "$g" ] && kill -USR1 "$g" 2>/dev/null; exit "$c"'
)
FENCE_GRACE_S = 5  # a fenced pod's SIGTERM-to-SIGKILL time; the server's config check counts it


# WATCH waits, without polling, until no agent holds the lock (flock(1) blocks on it), then
# sleeps until the server was last heard (ARRANGER_SERVER_HEARD's mtime) plus the fence
# timeout the file holds (in milliseconds). If still no agent holds the lock, it marks the run
# Fenced (for the next agent) and stops the pod's group: SIGTERM, then SIGKILL after the
# grace, which ends the shim too (the run's exit code is then unknown: it is reported Killed,
# Fenced). A timeout of 0 never fences. An agent that took the lock meanwhile keeps the pod.
# Told to end (TERM, USR1), it stops the last program it started in the background: $!, not
# $p, since the trap may run after a fork and before the assignment to p.
def watch_script(stop: str) -> str:
    """watch_script: the fence watch, ending in `stop` (shell) once it fences."""
    return f"""
trap 'kill $! 2>/dev/null; exit 0' TERM USR1
h=$ARRANGER_SERVER_HEARD
while :; do
  flock -s "$ARRANGER_AGENT_LOCK" true & p=$!; wait $p
  read t < "$h" || exit 0
  [ "$t" -gt 0 ] 2>/dev/null || exit 0
  left=$(( $(date -r "$h" +%s%3N) + t - $(date +%s%3N) ))
  if [ "$left" -gt 0 ]; then
    sleep "$((left / 1000)).$(printf %03d $((left % 1000)))" & p=$!; wait $p; continue
  fi
  flock -n -s "$ARRANGER_AGENT_LOCK" true || continue
  echo Fenced > "$ARRANGER_FENCE_MARK"
  echo "arranger: fenced: no agent heard the server for $((t / 1000)) s; stopping the pod" >&2
  {stop}
done
"""


WATCH = watch_script(
    f"trap '' TERM; kill -TERM 0; sleep {FENCE_GRACE_S} & p=$!; wait $p; kill -KILL 0"
)
# CONTAINER_WATCH fences a container the same way from a process of its own (a container runs
# under podman's conmon, not under a shim): it stops the container with podman (its command
# line is the script's arguments) and ends when the container's conmon does (tail --pid
# notices within a second), or when told (TERM).
CONTAINER_WATCH = (
    '{ tail --pid="$ARRANGER_CONMON" -f /dev/null; kill -USR1 $$; } </dev/null & '
    + watch_script(
        f'"$@" stop --time {FENCE_GRACE_S} "$ARRANGER_CONTAINER" >/dev/null 2>&1; exit 0'
    )
)


def watch_container(
    fence: FenceFiles,
    conmon: int,
    container: str,
    podman: Sequence[str],
    exit_file: Path,
    log_path: Path,
) -> subprocess.Popen[bytes] | None:
    """watch_container starts CONTAINER_WATCH for a container whose monitor is `conmon`: it
    stops the container while no agent runs past the fence timeout, marking the run Fenced in
    exit_file's ".kill", as a shim does for a process. None where flock(1) is missing."""
    if launcher.which("flock") is None or launcher.which("tail") is None:
        return None
    values = {
        "ARRANGER_AGENT_LOCK": str(fence.lock),
        "ARRANGER_SERVER_HEARD": str(fence.heard),
        "ARRANGER_FENCE_MARK": str(exit_file.with_suffix(".kill")),
        "ARRANGER_CONMON": str(conmon),
        "ARRANGER_CONTAINER": container,
    }
    with open_log(log_path) as log_file:
        return subprocess.Popen(
            [launcher.SHELL, "-c", CONTAINER_WATCH, "arranger-fence", *podman],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd="/",
            env=launcher.root_env(**values),
            start_new_session=True,
            close_fds=True,
        )


def spawn(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path,
    log_path: Path,
    exit_file: Path,
    tools: launcher.Tools,
    user: PodUser | None = None,
    cgroup_procs: Sequence[Path] = (),
    fence: FenceFiles | None = None,
    gate: int | None = None,
    nproc: int = 0,
) -> tuple[subprocess.Popen[bytes], int]:
    """spawn starts argv under the shim as the leader of a new session (so a new process
    group), with stdout and stderr appended to log_path and stdin from /dev/null, as `user`
    when given, in the cgroups whose cgroup.procs files are given; the shim writes the exit
    code to exit_file (created here, never through a symlink). With `fence`, the shim
    fences the pod while no agent runs (WATCH), marking it in exit_file's ".kill". With `gate`
    (a pipe's read end) the shim runs the pod only once a line comes on it. The launcher sets
    the pod's RLIMIT_NPROC to `nproc` (0: as inherited). Returns the shim and the
    launcher's spec memfd (see launcher.failure), which the caller closes. Raises
    launcher.LaunchError for a spec that cannot be launched, OSError when the shim cannot start."""
    spec = launcher.spec_fd(argv, env, cwd, nproc)
    try:
        ids = (user.uid, user.gid, user.groups) if user is not None else (None, 0, ())
        command = launcher.command(tools, spec, *ids)
        exit_fd = open_private(exit_file)
        try:
            log = log_fd(log_path)
            try:
                executable, args = shim_argv(tools, command)
                values = _shim_values(cgroup_procs, exit_file, fence, gate, tools)
                child = subprocess.Popen(
                    args,
                    executable=executable,
                    stdin=exit_fd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd="/",
                    env=launcher.root_env(**values),
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=(spec,) if gate is None else (spec, gate),
                )
            finally:
                os.close(log)
        finally:
            os.close(exit_fd)
    except BaseException:
        os.close(spec)
        raise
    return child, spec


def spawn_helper(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path,
    tools: launcher.Tools,
    user: PodUser | None = None,
    cgroup_procs: Sequence[Path] = (),
    pass_fds: Sequence[int] = (),
) -> tuple[subprocess.Popen[bytes], int, int]:
    """spawn_helper starts argv as `spawn` starts a pod, for what runs as the pod's user before
    the pod does (its package's unpacker): under the shim, as the leader of a new session, as
    `user` when given, in the cgroups whose cgroup.procs files are given, with descriptors
    `pass_fds` open in it; no gate, no fence. The user is switched by setpriv and the launcher,
    never in a fork of the agent: a fork of a process with gRPC's threads runs gRPC's fork
    handler, which may crash the child. Its stdout and stderr go to a memfd, and the shim's
    exit code record to another, so it leaves no file behind. Returns the shim, the
    launcher's spec memfd (see launcher.failure) and the output memfd, which the caller
    closes. Raises launcher.LaunchError or OSError as spawn does."""
    spec = launcher.spec_fd(argv, env, cwd)
    output = -1
    try:
        output = os.memfd_create("arranger-helper-output", os.MFD_CLOEXEC)
        ids = (user.uid, user.gid, user.groups) if user is not None else (None, 0, ())
        command = launcher.command(tools, spec, *ids)
        executable, args = shim_argv(tools, command)
        values = {"ARRANGER_CGROUP_PROCS": " ".join(map(str, cgroup_procs))}
        record = os.memfd_create("arranger-helper-exit", os.MFD_CLOEXEC)
        try:
            child = subprocess.Popen(
                args,
                executable=executable,
                stdin=record,
                stdout=output,
                stderr=subprocess.STDOUT,
                cwd="/",
                env=launcher.root_env(**values),
                start_new_session=True,
                close_fds=True,
                pass_fds=(spec, *pass_fds),
            )
        finally:
            os.close(record)
    except BaseException:
        os.close(spec)
        if output >= 0:
            os.close(output)
        raise
    return child, spec, output


def shim_argv(tools: launcher.Tools, command: Sequence[str]) -> tuple[str, list[str]]:
    """shim_argv: the program and arguments that run `command` under the shim: the compiled
    one (shim.c, which does what SHIM and WATCH do without a shell, a subshell and flock(1)
    per pod) where the agent built it, else the shell running SHIM. Either's command line
    says "arranger-shim"."""
    if tools.shim is not None:
        return tools.shim, ["arranger-shim", *command]
    return tools.shell, [tools.shell, "-c", SHIM, "arranger-shim", *command]


def _shim_values(
    cgroup_procs: Sequence[Path],
    exit_file: Path,
    fence: FenceFiles | None,
    gate: int | None,
    tools: launcher.Tools,
) -> dict[str, str]:
    """_shim_values: the shim's environment beyond root_env, all of the agent's making. The
    shell's shim fences only where flock(1) is installed; the compiled one needs nothing."""
    values = {"ARRANGER_CGROUP_PROCS": " ".join(map(str, cgroup_procs))}
    if gate is not None:
        values["ARRANGER_GATE_FD"] = str(gate)
    if fence is not None and (tools.shim is not None or launcher.which("flock") is not None):
        values.update(
            ARRANGER_AGENT_LOCK=str(fence.lock),
            ARRANGER_SERVER_HEARD=str(fence.heard),
            ARRANGER_FENCE_MARK=str(exit_file.with_suffix(".kill")),
        )
        if tools.shim is None:
            values["ARRANGER_WATCH"] = WATCH
        else:
            values["ARRANGER_FENCE_GRACE_S"] = str(FENCE_GRACE_S)
    return values


def open_log(path: Path) -> BinaryIO:
    """open_log: the pod's log file for appending (see log_fd)."""
    return os.fdopen(log_fd(path), "ab")


def log_fd(path: Path) -> int:
    """log_fd: a descriptor of the pod's log file for appending (O_APPEND: writers never
    overwrite each other, and dropping its oldest part keeps their offsets valid), never
    through a symlink; the caller closes it."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, 0o600)


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
    """started_at: when the process started, None if it is gone: psutil's create_time (the
    start in clock ticks after boot, over the ticks per second, plus the boot time), from one
    read of /proc/PID/stat and the boot time read once per agent; psutil itself where /proc
    cannot tell."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            stat = os.read(fd, 4096)
        finally:
            os.close(fd)
        ticks = int(stat.rpartition(b")")[2].split()[19])  # field 22 of proc(5): starttime
        return ticks / _CLOCK_TICKS + _boot_time()
    except (OSError, ValueError, IndexError):
        pass
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@functools.cache
def _boot_time() -> float:
    """_boot_time: /proc/stat's btime, as psutil.boot_time() reads it."""
    with open("/proc/stat", "rb") as f:
        for line in f:
            if line.startswith(b"btime"):
                return float(line.split()[1])
    raise ValueError("no btime in /proc/stat")


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
