"""exec_session runs a command inside one of the node's running pods (the API's ExecPod).

A plain process pod's command runs as the pod did: the agent's shell joins the pod's cgroups
(so its limits and GPU device filter hold) and runs the launcher through setpriv as the pod's
account, with the pod's environment and working directory, kept in the run's record when it
started (`exec_record`). A container pod's runs through `podman exec` in its container (its
environment, working directory and user). Nothing of the command reaches a command line: the
launcher reads it from a memfd, as a pod's own.

With `tty` the command runs on a new terminal (a pty: setsid makes it the controlling one),
its output one stream; without, on pipes. It ends when it exits, when the pod's run ends (the
pod's cgroup takes it too), or when its caller goes (`inputs` end): the agent kills its process
group. A pod started by an agent of a release before exec has no record of its environment
and refuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import struct
import subprocess
import termios
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import structlog

from arranger.agent import launcher, process
from arranger.agent.podman import container_name, podman_env
from arranger.agent.supervisor import Supervisor
from arranger.states import PodState

log = structlog.get_logger("arranger.agent")

CHUNK = 32 * 1024  # bytes of output per message, at most
DRAIN_S = 2.0  # how long output is still read once the command has exited
NOT_RUN = -1  # the code of a command that never ran
MAX_SIZE = 65535  # a terminal's rows or columns at most
MARK = "ARRANGER_EXEC"  # the variable that marks a container command's processes
# The agent's shell, as root where pods run as others: join the pod's cgroups, then run the rest.
JOIN = (
    'for f in $ARRANGER_CGROUP_PROCS; do echo $$ > "$f" || exit 125; done; '
    'unset ARRANGER_CGROUP_PROCS; exec "$@"'
)


@dataclass(frozen=True)
class ExecCommand:
    """ExecCommand: what to run, in which run of a pod (`key`: `<uid>.<attempt>`)."""

    key: str
    argv: Sequence[str]
    tty: bool = False
    stdin: bool = False
    rows: int = 0
    cols: int = 0


@dataclass(frozen=True)
class Input:
    """Input: what the caller sends: bytes, the end of its input, or its terminal's size."""

    data: bytes = b""
    closed: bool = False
    rows: int = 0
    cols: int = 0


Send = Callable[[str, bytes], Awaitable[None]]  # ("stdout" | "stderr", bytes)


class Refused(Exception):
    """Refused: the command cannot run; the message says why."""


@dataclass(frozen=True)
class Spawned:
    """Spawned: a command started, with its terminal and the launcher's memfd."""

    proc: asyncio.subprocess.Process
    terminal: int | None  # the pty's master, with tty
    spec: int | None  # the launcher's memfd (see launcher.failure)


async def start(
    command: ExecCommand,
    record: Mapping[str, Any],
    tools: launcher.Tools | None,
    cgroup_procs: Sequence[Path],
    nproc: int,
    podman_base: Sequence[str] | None,
    node_name: str,
    mark: str = "",
) -> Spawned:
    """start runs the command: in the container when `podman_base` is given (its processes
    marked with MARK=`mark`), else as the record's pod (raises Refused when it cannot)."""
    spec = None
    if podman_base is not None:
        flags = [*(["-i"] if command.stdin else []), *(["-t"] if command.tty else [])]
        flags += ["--env", f"{MARK}={mark}"]  # podman runs it under conmon, not in our group
        name = container_name(node_name, command.key)
        argv, env = [*podman_base, "exec", *flags, name, *command.argv], podman_env()
    else:
        if tools is None or "env" not in record:
            raise Refused("the pod was started by an agent of a release before exec")
        uid, gid, groups = record["user"]  # the pod's account, by number
        ids = (None, 0, ()) if uid == os.geteuid() else (int(uid), int(gid), groups)
        spec = launcher.spec_fd(command.argv, record["env"], Path(record["cwd"]), nproc)
        setsid = launcher.which("setsid") if command.tty else None
        ctty = [setsid, "--ctty"] if setsid else []
        launch = launcher.command(tools, spec, *ids)
        argv = [tools.shell, "-c", JOIN, "arranger-exec", *ctty, *launch]
        env = launcher.root_env(ARRANGER_CGROUP_PROCS=" ".join(map(str, cgroup_procs)))
    own_session = not (command.tty and "--ctty" in argv)  # else setsid makes the session
    terminal = slave = None
    stdin: int = subprocess.PIPE if command.stdin else subprocess.DEVNULL
    try:
        if command.tty:
            terminal, slave = os.openpty()
            os.set_blocking(terminal, False)
            resize(terminal, command.rows, command.cols)
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=slave if slave is not None else stdin,
            stdout=slave if slave is not None else subprocess.PIPE,
            stderr=slave if slave is not None else subprocess.PIPE,
            cwd="/",
            env=env,
            start_new_session=own_session,
            pass_fds=(spec,) if spec is not None else (),
        )
    except BaseException:
        for fd in (terminal, spec):
            if fd is not None:
                os.close(fd)
        raise
    finally:
        if slave is not None:
            os.close(slave)
    return Spawned(proc, terminal, spec)


def resize(terminal: int, rows: int, cols: int) -> None:
    """resize sets the terminal's size (0s: left as it is; at most MAX_SIZE each)."""
    if rows > 0 and cols > 0:
        size = struct.pack("HHHH", min(rows, MAX_SIZE), min(cols, MAX_SIZE), 0, 0)
        fcntl.ioctl(terminal, termios.TIOCSWINSZ, size)


async def run(
    started: Spawned,
    inputs: AsyncIterator[Input],
    send: Send,
    pod_ended: asyncio.Event,
    caller_gone: asyncio.Event,
    mark: str = "",
) -> tuple[int, str]:
    """run relays the started command's input and output until it ends (it exits, its pod
    ends, its caller goes); returns its exit code (128 + N for signal N; NOT_RUN with why)
    and a message ("" when it exited)."""
    proc = started.proc
    readers = _readers(started, send)
    feeding = asyncio.create_task(_feed(started, inputs))
    exited = asyncio.create_task(proc.wait())
    ended = asyncio.create_task(pod_ended.wait())
    gone = asyncio.create_task(caller_gone.wait())
    message = ""
    try:
        await asyncio.wait({exited, ended, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not exited.done():
            message = "the pod ended" if ended.done() else "the caller went away"
            _kill(proc.pid)
            if mark:
                await asyncio.to_thread(_kill_marked, mark)
            await exited
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DRAIN_S):
                await asyncio.gather(*readers, return_exceptions=True)
    finally:
        for task in (*readers, feeding, exited, ended, gone):
            task.cancel()
        await asyncio.gather(*readers, feeding, exited, ended, gone, return_exceptions=True)
        if proc.returncode is None:  # (once reaped, its group's id may be another's)
            _kill(proc.pid)
        code = process.exit_code(proc.returncode or 0)
        failed = launcher.failure(started.spec) if started.spec is not None else None
        for fd in (started.terminal, started.spec):
            if fd is not None:
                os.close(fd)
    if failed is not None and failed[0] == code:
        message = failed[1]
    return code, message


def _readers(started: Spawned, send: Send) -> list[asyncio.Task[None]]:
    proc = started.proc
    if started.terminal is not None:
        return [asyncio.create_task(_relay_terminal(started.terminal, send))]
    assert proc.stdout is not None and proc.stderr is not None
    return [
        asyncio.create_task(_relay(proc.stdout, "stdout", send)),
        asyncio.create_task(_relay(proc.stderr, "stderr", send)),
    ]


async def _relay(stream: asyncio.StreamReader, name: str, send: Send) -> None:
    while data := await stream.read(CHUNK):
        await send(name, data)


async def _relay_terminal(terminal: int, send: Send) -> None:
    """_relay_terminal sends what the terminal's command writes, until no process holds the
    terminal's other end (the read fails with EIO)."""
    loop = asyncio.get_running_loop()
    while True:
        readable = loop.create_future()
        loop.add_reader(terminal, readable.set_result, None)
        try:
            await readable
        finally:
            loop.remove_reader(terminal)
        try:
            data = os.read(terminal, CHUNK)
        except BlockingIOError:
            continue
        except OSError:  # EIO: the command and all it started have closed the terminal
            return
        if not data:
            return
        await send("stdout", data)


async def _feed(started: Spawned, inputs: AsyncIterator[Input]) -> None:
    """_feed writes the caller's input to the command and resizes its terminal."""
    proc, terminal = started.proc, started.terminal
    writer = proc.stdin
    async for item in inputs:
        if item.rows and terminal is not None:
            resize(terminal, item.rows, item.cols)
        if item.data:
            if terminal is not None:
                await _write_all(terminal, item.data)
            elif writer is not None and not writer.is_closing():
                writer.write(item.data)
                with contextlib.suppress(ConnectionError):
                    await writer.drain()
        if item.closed:
            if terminal is not None:
                with contextlib.suppress(OSError):
                    await _write_all(terminal, b"\x04")  # end of input, as a terminal says it
            elif writer is not None:
                writer.close()


async def _write_all(fd: int, data: bytes) -> None:
    loop = asyncio.get_running_loop()
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            writable = loop.create_future()
            loop.add_writer(fd, writable.set_result, None)
            try:
                await writable
            finally:
                loop.remove_writer(fd)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _kill_marked(mark: str) -> None:
    """_kill_marked kills the processes whose environment holds MARK=`mark` (a container
    command's, which run under podman's conmon, in no group of the agent's)."""
    wanted = f"{MARK}={mark}".encode()
    for proc in psutil.process_iter():
        with (
            contextlib.suppress(OSError, psutil.Error),
            open(f"/proc/{proc.pid}/environ", "rb") as f,
        ):
            if wanted in f.read().split(b"\0"):
                proc.kill()


async def serve(
    supervisor: Supervisor,
    command: ExecCommand,
    inputs: AsyncIterator[Input],
    send: Send,
    caller_gone: asyncio.Event,
) -> tuple[int, str]:
    """serve runs the command in its pod's run on this node, if that run is Running; returns
    as `run` does (NOT_RUN and why when it cannot run)."""
    uid, _, attempt = command.key.rpartition(".")
    pod_run = supervisor.runs.get(uid)
    if pod_run is None or str(pod_run.attempt) != attempt:
        return NOT_RUN, f"no attempt {attempt} of this pod runs on node {supervisor.node_name}"
    if pod_run.state != PodState.RUNNING or pod_run.kill_requested:
        return NOT_RUN, f"the pod is {pod_run.state.value} on node {supervisor.node_name}"
    mark = os.urandom(8).hex()
    try:
        record = json.loads(supervisor.files.record_path(uid).read_text())
        containers = supervisor.containers
        podman = getattr(containers, "podman", None) if pod_run.runtime != "process" else None
        if pod_run.runtime != "process" and podman is None:
            raise Refused(f"this agent has no {pod_run.runtime} runtime")
        started = await start(
            command,
            record.get("exec") or {},
            supervisor.tools,
            supervisor.processes.cgroup_procs(command.key),
            supervisor.processes.nproc,
            podman.base if podman is not None else None,
            supervisor.node_name,
            mark,
        )
    except Exception as exc:  # a record, a spec, a size: whatever it was, nothing runs
        return NOT_RUN, f"cannot run it: {exc}"
    log.info("exec", pod=command.key, program=command.argv[0], tty=command.tty)
    return await run(started, inputs, send, pod_run.ended, caller_gone, mark if podman else "")


async def emptied(queue: asyncio.Queue[Any]) -> None:
    """emptied takes whatever comes on `queue`, for good (a command's input left unread once
    it has ended, so that its call is not held up)."""
    while True:
        await queue.get()
