"""`arranger exec`: its arguments, the requests it makes of its standard input, its exit status,
and the terminal it always gives back; the CLI as a real process against a scripted stand-in
for the server's ExecPod (see test_exec_sdk), no cluster."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import io
import os
import signal
import struct
import sys
import termios
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from arranger.client.exec_command import (
    Signalled,
    exit_status,
    raw_terminal,
    read_input,
    relay,
)
from arranger.client.parser import build_parser
from arranger.v1 import arranger_pb2, job_pb2
from tests.client.test_exec_sdk import (
    WAIT_S,
    Puppet,
    ended,
    inputs,
    serving,
    started,
    stderr,
    stdout,
)
from tests.conftest import eventually

# The CLI talks plain to the stand-in, whatever this shell would give it.
ENV = {k: v for k, v in os.environ.items() if not k.startswith("ARRANGER_")}


def parsed(*argv: str) -> argparse.Namespace:
    return build_parser("exec").parse_args(["exec", *argv])


@pytest.mark.parametrize(
    ("argv", "command", "stdin", "tty", "pod"),
    [
        (["j", "--", "ls", "-la"], ["ls", "-la"], False, False, ""),
        (["-it", "j", "--", "bash"], ["bash"], True, True, ""),
        (
            ["j", "-it", "--pod", "actors-0", "--", "bash", "-l"],
            ["bash", "-l"],
            True,
            True,
            "actors-0",
        ),
        (["j", "-i", "--", "python", "--", "-i"], ["python", "--", "-i"], True, False, ""),
        (["j", "--stdin", "--tty", "--", "--pod"], ["--pod"], True, True, ""),
    ],
)
def test_the_command_is_every_word_after_the_first_dashes(
    argv: list[str], command: list[str], stdin: bool, tty: bool, pod: str
) -> None:
    args = parsed(*argv)
    assert (args.job, args.command, args.stdin, args.tty, args.pod) == (
        "j",
        command,
        stdin,
        tty,
        pod,
    )


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["j"], "no command: give it after --"),
        (["j", "--"], "no command: give it after --"),
        (["j", "-it", "--"], "no command: give it after --"),
        (["j", "ls", "-la"], "unrecognized arguments: ls -la (the command goes after --)"),
        (["--", "j", "ls"], "the following arguments are required: job"),
    ],
)
def test_a_missing_or_misplaced_command_is_refused_with_its_usage(
    argv: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parsed(*argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert "usage: arranger exec [-h] [--pod POD] [-i] [-t] JOB -- COMMAND [ARGS ...]" in err
    assert f"arranger exec: error: {why}" in err


def test_the_help_says_who_may_and_what_is_recorded(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parsed("--help")
    text = " ".join(capsys.readouterr().out.split())
    for said in (
        "a running pod",
        "environment, working directory, cgroups and account",
        "inside its container",
        "ends when the pod does",
        "owner or an admin may, never with a job's token",
        "event of the job naming who ran what (its arguments hidden from other users)",
    ):
        assert said in text


def test_the_output_goes_where_it_belongs_and_started_is_not_shown() -> None:
    out, err = io.BytesIO(), io.BytesIO()
    replies = [started(), stdout(b"a"), stderr(b"b"), stdout(b"c"), ended(4, "")]
    seen: list[bytes] = []
    ended_ = relay(replies, out, err, lambda: seen.append(out.getvalue()))
    assert ended_ == job_pb2.ExecEnded(exit_code=4)
    assert (out.getvalue(), err.getvalue(), seen) == (b"ac", b"b", [b""])


@pytest.mark.parametrize(
    ("code", "message", "status", "said"),
    [
        (0, "", 0, ""),
        (137, "", 137, ""),
        (-1, "pod p-leader ended", 1, "error: pod p-leader ended\n"),
        (-1, "", 1, "error: the command ended with no exit code\n"),
        (256, "", 1, "error: the command ended with exit code 256\n"),
    ],
)
def test_the_exit_status_is_the_command_s_or_1_with_why(
    code: int, message: str, status: int, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert exit_status(job_pb2.ExecEnded(exit_code=code, message=message)) == status
    assert capsys.readouterr().err == said


@contextlib.contextmanager
def terminal() -> Iterator[tuple[int, int]]:
    """terminal: a pseudo-terminal's (master, slave), 24 rows of 80 columns."""
    master, slave = os.openpty()
    try:
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        yield master, slave
    finally:
        os.close(master)
        os.close(slave)


def is_raw(fd: int) -> bool:
    local = termios.tcgetattr(fd)[3]
    return not local & (termios.ICANON | termios.ECHO | termios.ISIG)


def test_the_terminal_is_raw_while_it_runs_and_given_back_after_an_error() -> None:
    with terminal() as (_, slave):
        before = termios.tcgetattr(slave)
        with pytest.raises(RuntimeError), raw_terminal(slave):
            assert is_raw(slave)
            raise RuntimeError("the call failed")
        assert termios.tcgetattr(slave) == before


def test_a_signal_while_raw_gives_the_terminal_and_the_handler_back() -> None:
    handler = signal.getsignal(signal.SIGTERM)
    with terminal() as (_, slave):
        before = termios.tcgetattr(slave)
        with pytest.raises(Signalled) as raised, raw_terminal(slave):
            os.kill(os.getpid(), signal.SIGTERM)  # handled on this thread before kill returns
        assert raised.value.number == signal.SIGTERM
        assert termios.tcgetattr(slave) == before
    assert signal.getsignal(signal.SIGTERM) == handler


async def test_input_is_read_in_chunks_of_64_kib_from_a_pipe_and_a_file(tmp_path: Path) -> None:
    data = os.urandom(150 * 1024)
    path = tmp_path / "input"
    path.write_bytes(data)
    with path.open("rb") as file:
        chunks = [chunk async for chunk in read_input(file.fileno())]
    assert [len(c) for c in chunks] == [65536, 65536, len(data) - 131072]
    readable, writable = os.pipe()
    os.write(writable, b"typed\n")
    os.close(writable)
    try:
        async with asyncio.timeout(WAIT_S):
            assert [chunk async for chunk in read_input(readable)] == [b"typed\n"]
    finally:
        os.close(readable)


async def arranger_exec(
    address: str, *args: str, stdin: int, stdout: int = asyncio.subprocess.PIPE
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "arranger.client.cli",
        "--server",
        address,
        "exec",
        *args,
        stdin=stdin,
        stdout=stdout,
        stderr=asyncio.subprocess.PIPE,
        env=ENV,
    )


async def ended_process(proc: asyncio.subprocess.Process) -> tuple[int, bytes, bytes]:
    """ended_process: the process's exit status, then what is left of its output and errors."""
    async with asyncio.timeout(WAIT_S):
        out = await proc.stdout.read() if proc.stdout else b""
        err = await proc.stderr.read() if proc.stderr else b""
        return await proc.wait(), out, err


@pytest.mark.parametrize("source", ["pipe", "file"])
async def test_dash_i_sends_stdin_in_requests_of_64_kib_then_input_closed(
    source: str, tmp_path: Path
) -> None:
    data = os.urandom(200 * 1024 + 5)
    puppet = Puppet()

    async def write(pipe: asyncio.StreamWriter) -> None:
        pipe.write(data)
        await pipe.drain()
        pipe.close()

    async with serving(puppet) as address:
        writing = None
        if source == "file":
            path = tmp_path / "input"
            path.write_bytes(data)
            with path.open("rb") as file:
                proc = await arranger_exec(
                    address, "j", "--pod", "w-1", "-i", "--", "cat", stdin=file.fileno()
                )
        else:
            proc = await arranger_exec(
                address, "j", "--pod", "w-1", "-i", "--", "cat", stdin=asyncio.subprocess.PIPE
            )
            assert proc.stdin is not None
            writing = asyncio.create_task(write(proc.stdin))
        first = await puppet.request()
        assert first is not None
        assert first.start == arranger_pb2.ExecStart(
            job="j", pod="w-1", command=["cat"], stdin=True
        )
        puppet.reply(started())
        received = await puppet.requests_until_closed()
        if writing is not None:
            await writing
        puppet.reply(stdout(b"".join(inputs(received))), ended(7), None)
        status, out, err = await ended_process(proc)
    assert status == 7 and out == data and err == b""
    assert all(0 < len(chunk) <= 65536 for chunk in inputs(received))
    assert b"".join(inputs(received)) == data and received[-1].input_closed


async def test_without_dash_i_input_closes_once_it_runs_and_stdin_is_not_read() -> None:
    puppet = Puppet()
    readable, writable = os.pipe()
    try:
        async with serving(puppet) as address:
            proc = await arranger_exec(address, "j", "--", "nvidia-smi", stdin=readable)
            first = await puppet.request()
            assert first is not None and not first.start.stdin and not first.start.tty
            puppet.reply(started())
            second = await puppet.request()
            assert second is not None and second.input_closed
            puppet.reply(stdout(b"GPU 0\n"), stderr(b"warning\n"), ended(0), None)
            status, out, err = await ended_process(proc)
    finally:
        os.close(writable)
        os.close(readable)
    assert (status, out, err) == (0, b"GPU 0\n", b"warning\n")


async def test_a_command_that_never_ran_or_a_refusal_says_why_and_exits_1() -> None:
    puppet = Puppet()
    puppet.reply(started(), ended(-1, "pod j-leader ended"), None)
    async with serving(puppet) as address:
        proc = await arranger_exec(
            address, "j", "--", "sleep", "1d", stdin=asyncio.subprocess.DEVNULL
        )
        assert await ended_process(proc) == (1, b"", b"error: pod j-leader ended\n")
    puppet = Puppet()
    puppet.reply((grpc.StatusCode.PERMISSION_DENIED, "only the job's owner or an admin may"))
    async with serving(puppet) as address:
        proc = await arranger_exec(address, "j", "--", "id", stdin=asyncio.subprocess.DEVNULL)
        assert await ended_process(proc) == (
            1,
            b"",
            b"error: only the job's owner or an admin may\n",
        )


async def test_dash_it_on_a_terminal_is_raw_follows_its_size_and_gives_it_back() -> None:
    puppet = Puppet()
    with terminal() as (master, slave):
        before = termios.tcgetattr(slave)
        async with serving(puppet) as address:
            proc = await arranger_exec(address, "j", "-it", "--", "bash", stdin=slave, stdout=slave)
            first = await puppet.request()
            assert first is not None and first.start.tty and first.start.stdin
            assert first.start.size == job_pb2.TerminalSize(rows=24, cols=80)
            assert not is_raw(slave)  # Ctrl-C still ends it, until the command runs
            puppet.reply(started())
            await eventually(lambda: is_raw(slave), WAIT_S, "the terminal in raw mode")
            os.write(master, b"hi\x03")  # Ctrl-C is a key like any other
            typed = b""
            while typed != b"hi\x03":
                request = await puppet.request()
                assert request is not None and request.WhichOneof("body") == "input"
                typed += request.input
            puppet.reply(stdout(b"echo:" + typed))
            async with contextlib.aclosing(read_input(master)) as shown:
                seen = b""
                async with asyncio.timeout(WAIT_S):
                    async for chunk in shown:
                        seen += chunk
                        if b"echo:hi\x03" in seen:
                            break
            fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 132, 0, 0))
            proc.send_signal(signal.SIGWINCH)
            resize = await puppet.request()
            assert resize is not None and resize.resize == job_pb2.TerminalSize(rows=50, cols=132)
            puppet.reply(ended(-1, "pod j-leader ended"), None)
            status, _, err = await ended_process(proc)
        assert (status, err) == (1, b"error: pod j-leader ended\n")
        assert termios.tcgetattr(slave) == before
