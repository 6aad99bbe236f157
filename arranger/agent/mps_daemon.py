"""mps_daemon: one NVIDIA MPS control daemon as the agent knows it (see mps for the daemons of a
node's GPU shares): who it is (its pid and the process's start time, so a reused pid is never
taken for it), its record on disk for the next agent, and the control program run as an
account.

The record (`daemon.json` in the daemon's directory, which only the agent writes) holds its
key (its group; the run an earlier release made it for), pid, start time, owner and the runs
it holds; it is replaced whole, so a reader sees the old record or the new. The control
program is run as subprocess starts it (close_fds, a new session, no preexec_fn), so no Python
code runs in a fork of the agent and its gRPC threads; a root agent runs it as the pod's
account through setpriv, never as root in a directory that account writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from arranger.agent import process

COMMAND_TIMEOUT_S = 10.0  # one run of the control program (-d, or one command)
RECORD = "daemon.json"


class MpsError(Exception):
    """MpsError: a daemon could not be started or told its limits; the message says why."""


@dataclass(frozen=True)
class Daemon:
    """Daemon: one group's control daemon, by its directory, pid and the process's start time
    (pid 0: unknown, as for a daemon whose start no record kept). `key` is its group (or the
    run an earlier release made it for; "" where no record says)."""

    key: str
    home: Path
    pid: int = 0
    started_at: float = 0.0
    owner: tuple[int, int] | None = None  # the account it runs as (None: the agent's)

    def alive(self) -> bool:
        """alive: the recorded process still runs (not a zombie, not a reused pid)."""
        if self.pid <= 0:
            return False
        try:
            proc = psutil.Process(self.pid)
            return (
                abs(proc.create_time() - self.started_at) < 0.05
                and proc.status() != psutil.STATUS_ZOMBIE
            )
        except psutil.Error:
            return False

    def gone_within(self, timeout_s: float) -> bool:
        """gone_within: whether the process has ended within timeout_s (a thread's wait: an
        exited daemon is no child of the agent's to be awaited)."""
        deadline = time.monotonic() + timeout_s
        while self.alive():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True


def write_record(daemon: Daemon, runs: Iterable[str]) -> None:
    """write_record: what the next agent needs to know of a daemon and the runs it holds."""
    body = {
        "key": daemon.key,
        "pid": daemon.pid,
        "started_at": daemon.started_at,
        "owner": list(daemon.owner) if daemon.owner else None,
        "runs": sorted(runs),
    }
    fresh = daemon.home / (RECORD + ".new")
    with os.fdopen(process.open_private(fresh), "w") as f:
        json.dump(body, f)
    os.replace(fresh, daemon.home / RECORD)


def read_record(home: Path) -> tuple[Daemon, list[str]]:
    """read_record: the daemon a directory's record names and the runs it holds (key "", pid 0
    and no runs where none is readable: one whose start an agent did not live to record; an
    earlier release's record names no runs: its key is its one run)."""
    try:
        body = json.loads((home / RECORD).read_text())
        owner = body.get("owner")
        daemon = Daemon(
            str(body["key"]),
            home,
            int(body["pid"]),
            float(body["started_at"]),
            (int(owner[0]), int(owner[1])) if owner else None,
        )
        runs = [str(run) for run in body.get("runs", [daemon.key])]
    except (OSError, ValueError, KeyError, TypeError):
        return Daemon("", home), []
    return daemon, runs


def dir_owner(path: Path) -> tuple[int, int] | None:
    """dir_owner: the account owning `path` if it is a directory (not a link), else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_uid, st.st_gid) if stat.S_ISDIR(st.st_mode) else None


async def run_control(
    control: str,
    setpriv: str | None,
    args: list[str],
    env: Mapping[str, str],
    command: str | None,
    output: Path | None = None,
    owner: tuple[int, int] | None = None,
) -> tuple[int, str]:
    """run_control runs the control program once, as `owner` where the agent is root (through
    setpriv), with `command` on its stdin (its answer returned), or (None) with its output
    going to `output` (a daemonising run, whose daemon may keep what it was given open).
    Raises MpsError past COMMAND_TIMEOUT_S."""
    argv = [control, *args]
    if owner is not None and os.geteuid() == 0 and owner[0] != 0:
        if setpriv is None:
            raise MpsError("setpriv not found: the daemon would run as root")
        uid, gid = owner
        argv = [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *argv]
    out_fd = process.open_private(output) if output is not None else subprocess.PIPE
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=dict(env),
            cwd="/",
            close_fds=True,
            start_new_session=True,
            stdout=out_fd,
            stderr=subprocess.STDOUT,
            stdin=subprocess.PIPE if command is not None else subprocess.DEVNULL,
        )
    finally:
        if output is not None:
            os.close(out_fd)
    try:
        async with asyncio.timeout(COMMAND_TIMEOUT_S):
            data = command.encode() + b"\n" if command is not None else None
            said, _ = await proc.communicate(data)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise MpsError(f"{control} {' '.join(args)} took over {COMMAND_TIMEOUT_S} s") from None
    text = (said or b"").decode(errors="replace").strip()
    if output is not None:
        with contextlib.suppress(OSError):
            text = (await asyncio.to_thread(output.read_bytes)).decode(errors="replace")
    return proc.returncode or 0, text.strip()[-500:]
