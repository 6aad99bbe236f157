"""fence: no pod runs on past fenceTimeout after its node last heard the server.

The server replaces a silent node's pods only nodeTimeout (> fenceTimeout) after it last
heard the node, so a pod stopped by then never runs beside its replacement. Two guards stop
it, and the agent's data directory holds what they share:

- `agent.lock`: the running agent holds an exclusive flock on it for its whole life (so a
  second agent over the same directory refuses to start). The kernel drops it when the
  agent exits or crashes.
- `server-heard`: its mtime is when the agent last heard a server of its cluster (at most
  TOUCH_S late, so a shim fences early rather than late); it holds the fence timeout in
  milliseconds (0: never fence), as the server last said.

While the agent runs, it stops its pods itself once the server has been silent for the
fence timeout (Agent). While no agent runs, each pod's shim does (see process.WATCH): it waits
on the lock without polling, and once the lock is free sleeps until `server-heard`'s mtime
plus the timeout, then stops its pod unless an agent took the lock again meanwhile. An
agent that comes back in time adopts its pods as before, and takes the time it last heard
the server from the file: a restart never gives the pods a fresh fence timeout.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path

LOCK, HEARD = "agent.lock", "server-heard"
TOUCH_S = 0.5
ACQUIRE_S = 2.0  # how often, at most, hearing the server is written down


class AgentRunning(RuntimeError):
    """AgentRunning: another agent holds this data directory."""


@dataclass(frozen=True)
class FenceFiles:
    """FenceFiles: the paths a pod's shim watches (absolute, in the agent's data directory)."""

    lock: Path
    heard: Path


def files(data_dir: Path) -> FenceFiles:
    return FenceFiles(data_dir / LOCK, data_dir / HEARD)


class AgentLock:
    """AgentLock is the flock the running agent holds on `agent.lock`."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK
        self._fd: int | None = None

    def acquire(self) -> None:
        """acquire takes the lock; raises AgentRunning if another agent holds it. Pods' shims
        that find no agent take a shared lock for an instant (see process.WATCH), so a busy
        lock is tried again for up to ACQUIRE_S before it counts as another agent's."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.path, flags, 0o600)
        deadline = time.monotonic() + ACQUIRE_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise AgentRunning(
                        f"another arranger-agent runs over {self.path.parent}"
                    ) from None
                time.sleep(0.01)  # the agent is not serving yet: nothing waits on it
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None


class ServerContact:
    """ServerContact: when a server of this agent's cluster was last heard, and the fence
    timeout it asked for, kept in `server-heard` for the pods' shims and the next agent.
    Times are from time.monotonic(); the file holds wall-clock time."""

    def __init__(self, data_dir: Path, fence_timeout_s: float) -> None:
        """Takes the time and timeout an earlier agent wrote, if any; else starts from now
        with `fence_timeout_s` (until a server says otherwise)."""
        self.path = data_dir / HEARD
        self.fence_timeout_s = fence_timeout_s
        now = time.monotonic()
        try:
            mtime = self.path.stat().st_mtime
            self.fence_timeout_s = int(self.path.read_text().strip()) / 1000
        except (OSError, ValueError):
            self.last_heard = now
            self._write()
            return
        self.last_heard = now - max(0.0, time.time() - mtime)
        self._touched = self.last_heard

    def heard(self) -> None:
        """heard: a server of this cluster spoke just now (written at most every TOUCH_S)."""
        self.last_heard = now = time.monotonic()
        if now - self._touched >= TOUCH_S:
            with contextlib.suppress(OSError):
                os.utime(self.path)
                self._touched = now

    def set_timeout(self, fence_timeout_s: float) -> None:
        """set_timeout: the server's fence timeout, heard just now."""
        self.fence_timeout_s = fence_timeout_s
        self.last_heard = time.monotonic()
        self._write()

    def silent_s(self) -> float:
        return time.monotonic() - self.last_heard

    def _write(self) -> None:
        """_write puts the timeout, in milliseconds, with mtime now."""
        self._touched = time.monotonic()
        part = self.path.with_name(HEARD + ".part")
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(part, flags, 0o600)
            try:
                os.write(fd, f"{round(self.fence_timeout_s * 1000)}\n".encode())
            finally:
                os.close(fd)
            part.replace(self.path)
