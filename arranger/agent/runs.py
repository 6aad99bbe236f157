"""runs: a pod attempt as the supervisor holds it (PodRun), and what is kept of it on disk.

Under the data directory each pod has, by job: its log per attempt (`logs/<job>/<pod>/<n>.log`),
its scratch directory (`scratch/<job>/<pod>`) and its run record (`runs/<job>/<pod>.json`, with
`<pod>.<n>.exit`, the exit code its shim or container monitor keeps, and `<pod>.<n>.kill`, the
reason a stop was asked for). What is the pod's (its scratch directory, its log) belongs to its
account and no one else may read it; the directories above let others pass but not list; run
records stay the agent's alone. A record is written whole and renamed into place, so an agent
started again reads each one whole or not at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arranger.agent import process
from arranger.agent.datadir import PASSABLE, PRIVATE, make_dir, make_dirs
from arranger.agent.pod_state import Pod
from arranger.agent.runtime import ProcessRuntime
from arranger.states import PodState


@dataclass
class PodRun:
    """PodRun is one attempt of one pod on this node: what the shell holds for it (process,
    ports, runtime), and `pod`, its life as the state machine keeps it (see pod_state)."""

    uid: str
    attempt: int
    job_id: str
    pod_name: str
    pod: Pod
    pid: int = 0
    ports: dict[str, int] = field(default_factory=dict)
    start_time: float = 0.0
    runtime: str = ProcessRuntime.kind
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def key(self) -> str:
        """key: how runtimes and records name the run on this node, `<pod uid>.<attempt>`."""
        return f"{self.uid}.{self.attempt}"

    @property
    def state(self) -> PodState:
        return self.pod.state

    @property
    def exit_code(self) -> int | None:
        return self.pod.exit_code

    @property
    def reason(self) -> str:
        return self.pod.reason

    @property
    def finish_time(self) -> float:
        return self.pod.finish_time

    @property
    def kill_requested(self) -> bool:
        return self.pod.kill_requested


@dataclass(frozen=True)
class RunRecord:
    """RunRecord: a started run as its record keeps it; `body` is the whole record (with what
    its runtime needs to find the run again)."""

    uid: str
    attempt: int
    job_id: str
    pod_name: str
    runtime: str
    pid: int
    start_time: float
    ports: dict[str, int]
    body: Mapping[str, Any]


class RunFiles:
    """RunFiles: the logs, scratch directories and run records of pods under `data_dir`."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._job_dirs: set[str] = set()  # jobs whose logs/, scratch/ and runs/ directories exist

    def log_path(self, uid: str, attempt: int) -> Path:
        job_id, _, pod = uid.partition("/")
        return self.data_dir / "logs" / job_id / pod / f"{attempt}.log"

    def scratch_dir(self, uid: str) -> Path:
        job_id, _, pod = uid.partition("/")
        return self.data_dir / "scratch" / job_id / pod

    def record_path(self, uid: str) -> Path:
        job_id, _, pod = uid.partition("/")
        return self.data_dir / "runs" / job_id / f"{pod}.json"

    def exit_path(self, uid: str, attempt: int) -> Path:
        job_id, _, pod = uid.partition("/")
        return self.data_dir / "runs" / job_id / f"{pod}.{attempt}.exit"

    def kill_path(self, uid: str, attempt: int) -> Path:
        return self.exit_path(uid, attempt).with_suffix(".kill")

    # Run records.

    def record(self, run: PodRun, started: float, extra: Mapping[str, Any]) -> None:
        """record notes a started run (written whole, then renamed into place)."""
        path = self.record_path(run.uid)
        body = {
            **extra,
            "uid": run.uid,
            "attempt": run.attempt,
            "job_id": run.job_id,
            "pod_name": run.pod_name,
            "runtime": run.runtime,
            "pid": run.pid,
            "started": started,
            "start_time": run.start_time,
            "ports": run.ports,
        }
        part = path.with_suffix(".part")
        fd = process.open_private(part)
        try:
            os.write(fd, json.dumps(body).encode())
        finally:
            os.close(fd)
        os.replace(part, path)

    def unrecord(self, uid: str) -> None:
        """unrecord removes the run's record and every attempt's exit and kill files."""
        path = self.record_path(uid)
        prefix = f"{path.stem}."
        with contextlib.suppress(OSError), os.scandir(path.parent) as entries:
            for entry in entries:
                name = entry.name
                if name.startswith(prefix) and name.endswith((".exit", ".kill")):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
        path.unlink(missing_ok=True)

    def records(self) -> Iterator[tuple[Path, RunRecord | Exception]]:
        """records: every run record here, in path order, read, or the error that kept it
        from being read."""
        for path in sorted((self.data_dir / "runs").glob("*/*.json")):
            try:
                body = json.loads(path.read_text())
                yield (
                    path,
                    RunRecord(
                        body["uid"],
                        int(body["attempt"]),
                        body["job_id"],
                        body["pod_name"],
                        str(body.get("runtime", ProcessRuntime.kind)),
                        int(body["pid"]),
                        float(body["start_time"]),
                        {str(k): int(v) for k, v in body["ports"].items()},
                        body,
                    ),
                )
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                yield path, exc

    def kill_reason(self, uid: str, attempt: int) -> str:
        """kill_reason: why a stop of the attempt was asked for, as noted (see mark_killed);
        "" if none was."""
        path = self.kill_path(uid, attempt)
        if not path.exists():
            return ""
        return path.read_text().strip() or "Killed"

    def mark_killed(self, uid: str, attempt: int, reason: str) -> None:
        """mark_killed notes that a stop of the attempt was asked for, and why, for an agent
        started again (a stop outlives the agent that asked for it)."""
        with contextlib.suppress(OSError):
            fd = process.open_private(self.kill_path(uid, attempt))
            try:
                os.write(fd, reason.encode())
            finally:
                os.close(fd)

    def recorded_end(self, uid: str, attempt: int) -> float:
        """recorded_end: when the run ended, as its shim (or container monitor) recorded it,
        writing the exit file; now where there is none. A run that ended while no agent was
        there keeps its own end time, not the next agent's start."""
        now = time.time()
        try:
            recorded = self.exit_path(uid, attempt).stat()
        except OSError:
            return now
        # An empty file is only the one opened for the shim at launch: no exit was recorded.
        return min(recorded.st_mtime, now) if recorded.st_size > 0 else now

    # Directories.

    def pod_dir(
        self, uid: str, path: Path, mode: int, owner: tuple[int, int] | None = None
    ) -> None:
        """pod_dir makes one of pod `uid`'s directories. Its job's directories above are made
        once per job (and made again if they went missing meanwhile); `remove_job` forgets
        them."""
        job_id = uid.partition("/")[0]
        for again in (False, True):
            if job_id not in self._job_dirs:
                for kind, kind_mode in (
                    ("logs", PASSABLE),
                    ("scratch", PASSABLE),
                    ("runs", PRIVATE),
                ):
                    make_dirs(self.data_dir, Path(kind, job_id), kind_mode)
                self._job_dirs.add(job_id)
            try:
                make_dir(path, mode, owner)
                return
            except FileNotFoundError:
                self._job_dirs.discard(job_id)
                if again:
                    raise

    def kept_jobs(self, most: int) -> list[str]:
        """kept_jobs: the jobs (at most `most`) with logs, scratch or run records here."""
        found: set[str] = set()
        for kind in ("logs", "scratch", "runs"):
            with contextlib.suppress(OSError):
                found.update(
                    entry.name
                    for entry in os.scandir(self.data_dir / kind)
                    if entry.is_dir(follow_symlinks=False)
                )
        return sorted(found)[:most]

    def untouched_s(self, job_id: str, now: float) -> float:
        """untouched_s: how long ago anything of the job here last changed: its logs, run
        records and scratch directories (their entries, not the files a pod wrote within)."""
        newest = 0.0
        for kind in ("logs", "scratch", "runs"):
            top = self.data_dir / kind / job_id
            with contextlib.suppress(OSError):
                newest = max(newest, top.lstat().st_mtime)
                for entry in os.scandir(top):
                    newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
                    if kind == "logs" and entry.is_dir(follow_symlinks=False):
                        for log in os.scandir(entry.path):
                            newest = max(newest, log.stat(follow_symlinks=False).st_mtime)
        return max(0.0, now - newest)

    def remove_job(self, job_id: str) -> None:
        """remove_job removes the job's logs, scratch directories and run records."""
        self._job_dirs.discard(job_id)
        for kind in ("logs", "scratch", "runs"):
            shutil.rmtree(self.data_dir / kind / job_id, ignore_errors=True)

    @staticmethod
    def note_in_log(path: Path, line: str) -> None:
        """note_in_log adds the agent's own line to a pod's log (why it did not start)."""
        with contextlib.suppress(OSError), open(path, "a") as f:
            f.write(line + "\n")
