"""exec_command: `arranger exec JOB [--pod P] [-i] [-t] -- COMMAND [ARGS...]`, a command run in
a running pod, as `kubectl exec` (or `srun --jobid --overlap`) runs one.

Its output goes to this process's stdout and stderr as it comes, and its exit status is this
command's. With -i this process's stdin is its input; with -t it runs on a terminal of this
terminal's size, resized with it (SIGWINCH). With both on a terminal, the terminal is raw
from the moment the command runs (every key goes to it, Ctrl-C and Ctrl-D too; before, Ctrl-C
ends this process as it ends any command) and its settings are always given back, also when
a signal ends this process. The input is read on the client's
loop, never blocking it: a pipe or a terminal when it is ready, a file (which epoll refuses)
as it is.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import termios
import textwrap
import tty
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator
from types import FrameType
from typing import BinaryIO

from arranger.client.blocking import Client
from arranger.client.podexec import INPUT_LIMIT_BYTES
from arranger.v1 import arranger_pb2, job_pb2

STDIN = 0
USAGE = "arranger exec [-h] [--pod POD] [-i] [-t] JOB -- COMMAND [ARGS ...]"
DESCRIPTION = textwrap.fill(
    "Run a command in a running pod of a job, as `kubectl exec` does: with the pod's "
    "environment, working directory, cgroups and account (inside its container, for a pod "
    "of an image); it ends when the pod does. Only the job's owner or an admin may, never "
    "with a job's token. Each use is recorded as an event of the job naming who ran what "
    "(its arguments hidden from other users). The exit status is the command's (128 + N "
    "when signal N ended it); when it could not run, 1 and `error: WHY` on stderr.",
    width=79,
)
EPILOG = """examples:
  arranger exec myjob -- nvidia-smi
  arranger exec myjob --pod actors-0 -it -- bash
  tar c data | arranger exec myjob -i -- tar x -C /tmp"""
# Signals that end this process while the terminal is raw: raised as Signalled, so that the
# terminal's settings are given back on the way out (their default would leave it raw).
ENDING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Signalled(BaseException):
    """Signalled: signal `number` ended the command while the terminal was raw. Like
    KeyboardInterrupt, no `except Exception` on the way stops it."""

    def __init__(self, number: int) -> None:
        super().__init__(number)
        self.number = number


def add_exec_arguments(p: argparse.ArgumentParser) -> None:
    p.usage, p.description, p.epilog = USAGE, DESCRIPTION, EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("job", help="job name or id")
    p.add_argument(
        "--pod", default="", help="pod name, or its suffix like actors-0 (default: the leader)"
    )
    p.add_argument(
        "-i", "--stdin", action="store_true", help="pass this standard input to the command"
    )
    p.add_argument(
        "-t",
        "--tty",
        action="store_true",
        help="run it on a terminal (its output comes as stdout alone); with -i on a terminal, "
        "every key goes to it, Ctrl-C too",
    )


def cmd_exec(args: argparse.Namespace) -> int:
    raw = args.stdin and args.tty and os.isatty(STDIN)
    sizes = TerminalSizes(terminal_size()) if args.tty else None
    try:
        with (
            Client(args.server, token=args.token, ca=args.ca) as client,
            contextlib.ExitStack() as terminal,
        ):
            if sizes is not None:
                terminal.enter_context(sizes.following())

            def started() -> None:  # until the command runs, Ctrl-C is this process's
                if raw:
                    terminal.enter_context(raw_terminal(STDIN))

            replies = client.exec_replies(
                args.job,
                args.command,
                pod=args.pod,
                tty=args.tty,
                stdin=read_input(STDIN) if args.stdin else None,
                size=sizes.sent if sizes is not None else None,
                resizes=sizes.changes() if sizes is not None else None,
            )
            ended = relay(replies, sys.stdout.buffer, sys.stderr.buffer, started)
    except Signalled as signalled:
        return 128 + signalled.number
    return exit_status(ended)


def relay(
    replies: Iterable[arranger_pb2.ExecReply],
    stdout: BinaryIO,
    stderr: BinaryIO,
    started: Callable[[], None] = lambda: None,
) -> job_pb2.ExecEnded:
    """relay writes the command's output where it belongs as it comes (flushed, a chunk at a
    time) and returns how it ended. `started` is called once the command runs; where it runs
    is not shown: the output is the command's."""
    for reply in replies:
        body = reply.WhichOneof("body")
        if body == "started":
            started()
        elif body in ("stdout", "stderr"):
            out = stdout if body == "stdout" else stderr
            out.write(getattr(reply, body))
            out.flush()
        elif body == "ended":
            return reply.ended
    raise AssertionError("unreachable: exec_replies ends with `ended` or raises")


def exit_status(ended: job_pb2.ExecEnded) -> int:
    """exit_status: this command's exit status for how the remote one ended: its own code,
    or 1 with `error: WHY` on stderr when it never ran or no code is known (-1)."""
    if 0 <= ended.exit_code <= 255:
        return ended.exit_code
    from arranger.client.cli import report  # noqa: PLC0415 (cli imports the commands' parser)

    if ended.exit_code == -1:
        report(ended.message or "the command ended with no exit code")
    else:  # no status a process can exit with: 256 would read as 0
        report(f"the command ended with exit code {ended.exit_code}")
    return 1


async def read_input(fd: int) -> AsyncGenerator[bytes, None]:
    """read_input yields what `fd` gives, at most INPUT_LIMIT_BYTES at a time, until its end.
    A pipe or a terminal is read once it is ready, so the loop never waits on it; a file, or
    /dev/null, which epoll refuses to watch, never makes a read wait."""
    watchable = True
    while True:
        if watchable:
            try:
                await _readable(fd)
            except PermissionError:  # epoll's EPERM: a regular file
                watchable = False
        data = os.read(fd, INPUT_LIMIT_BYTES)
        if not data:
            return
        yield data


async def _readable(fd: int) -> None:
    """_readable returns once `fd` can be read without waiting. It watches `fd` only while it
    waits: a reader left in place would be called on every turn of the loop while the input
    waits for gRPC to take what was read before."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():  # called again on the loop's next turn if `await` is not done
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


def terminal_size() -> job_pb2.TerminalSize | None:
    """terminal_size: the size of the terminal this process writes to (stdout, else stdin or
    stderr), or None where none of them is one."""
    for fd in (1, 0, 2):
        try:
            size = os.get_terminal_size(fd)
        except OSError:
            continue
        return job_pb2.TerminalSize(rows=size.lines, cols=size.columns)
    return None


class TerminalSizes:
    """TerminalSizes follows the terminal's size: `sent` is the last one the command was
    told of, and `changes` yields each new one, told of by SIGWINCH, on the loop that reads
    it (the client's) while the handler runs on the main thread."""

    def __init__(self, first: job_pb2.TerminalSize | None) -> None:
        self.sent = first
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    @contextlib.contextmanager
    def following(self) -> Iterator[None]:
        """following handles SIGWINCH while it lasts, then gives the old handler back."""
        old = signal.signal(signal.SIGWINCH, lambda number, frame: self.changed())
        try:
            yield
        finally:
            signal.signal(signal.SIGWINCH, old)

    def changed(self) -> None:
        """changed wakes `changes`, from any thread. One before `changes` runs is caught up
        with when it first reads the size."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed
                loop.call_soon_threadsafe(self._changed.set)

    async def changes(self) -> AsyncGenerator[job_pb2.TerminalSize, None]:
        self._changed = asyncio.Event()  # of this loop
        self._loop = asyncio.get_running_loop()
        while True:
            size = terminal_size()
            if size is not None and size != self.sent:
                self.sent = size
                yield size
            await self._changed.wait()
            self._changed.clear()


@contextlib.contextmanager
def raw_terminal(fd: int) -> Iterator[None]:
    """raw_terminal puts the terminal `fd` in raw mode while it lasts (every key goes to the
    remote command as typed; the input typed ahead is kept) and always gives its settings
    back. A signal of ENDING that this process does not ignore raises Signalled meanwhile,
    so that they are given back before it ends."""
    saved = termios.tcgetattr(fd)
    handlers = {}
    for number in ENDING:
        if signal.getsignal(number) is not signal.SIG_IGN:
            handlers[number] = signal.signal(number, _signalled)
    try:
        tty.setraw(fd, termios.TCSANOW)
        yield
    finally:
        with contextlib.suppress(termios.error):  # the terminal is gone: nothing to give back
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        for number, handler in handlers.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)


def _signalled(number: int, frame: FrameType | None) -> None:
    raise Signalled(number)
