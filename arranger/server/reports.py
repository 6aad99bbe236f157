"""reports: the scalars a job's pods report (the in-job SDK's `job.report(step, **values)`),
and the texts they publish (`job.publish(checkpoint=...)`), as the server keeps them.

Each job keeps, per key, its latest value and a bounded history: at most MAX_POINTS points,
steps ascending; when it is full, every other point but the newest is dropped (the history
keeps its span at half the resolution, so a long run is seen whole, coarser the older it is).
A step below the newest (a learner restarted from an earlier checkpoint) drops the points
from that step on: the history is the run as it now stands. Each job has at most MAX_KEYS keys
and MAX_NOTES notes: a job's reports are bounded, and a user's with its jobs
(limits.jobsPerUser).

A report is kept in memory only once stored (copy on write: `updated` makes the new state,
`put` installs it after its write), so memory never runs ahead of the store; the reports of
one job are taken one at a time (`lock`).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from arranger.v1 import arranger_pb2, job_pb2

MAX_KEYS = 64  # reported keys of one job
MAX_POINTS = 256  # kept points of one key
MAX_NOTES = 16  # published texts of one job
MAX_NOTE_CHARS = 1024
MAX_POINTS_PER_CALL = 1000
_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_./-]{0,63}")


@dataclass
class Series:
    """Series: one key's kept points (steps ascending, one value each)."""

    steps: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def add(self, step: int, value: float) -> None:
        """add keeps a point (see the module: a lower step rewinds, a full history thins)."""
        if self.steps and step <= self.steps[-1]:
            at = next(i for i, s in enumerate(self.steps) if s >= step)
            del self.steps[at:], self.values[at:]
        self.steps.append(step)
        self.values.append(value)
        if len(self.steps) > MAX_POINTS:
            self.steps[:-1] = self.steps[:-1:2]
            self.values[:-1] = self.values[:-1:2]


@dataclass
class JobReports:
    """JobReports: one job's kept series by key, its notes, and the step of its latest
    report."""

    series: dict[str, Series] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    step: int = 0

    def latest(self) -> dict[str, float]:
        """latest: each key's newest value."""
        return {key: s.values[-1] for key, s in self.series.items() if s.values}

    def copy(self) -> JobReports:
        series = {k: Series(list(s.steps), list(s.values)) for k, s in self.series.items()}
        return JobReports(series, dict(self.notes), self.step)

    def stored(self) -> tuple[int, str, str]:
        """stored: (step, series, notes) as the store keeps them (JSON)."""
        series = {k: [s.steps, s.values] for k, s in self.series.items()}
        return self.step, json.dumps(series, separators=(",", ":")), json.dumps(self.notes)


def reports_from(row: Mapping[str, Any]) -> JobReports:
    """reports_from: a job's reports as stored."""
    series = {
        k: Series(list(steps), list(values))
        for k, (steps, values) in json.loads(row["series"]).items()
    }
    return JobReports(series, json.loads(row["notes"]), int(row["step"]))


def problem(request: arranger_pb2.ReportValuesRequest) -> str:
    """problem: why a report is refused, naming the field ("" if it is not)."""
    if len(request.points) > MAX_POINTS_PER_CALL:
        return f"points: at most {MAX_POINTS_PER_CALL} a call"
    for i, point in enumerate(request.points):
        if point.step < 0:
            return f"points[{i}].step: must be >= 0"
        for key, value in point.values.items():
            if not _KEY.fullmatch(key):
                return f"points[{i}].values: key {key[:70]!r} is not [A-Za-z][A-Za-z0-9_./-]*, at most 64 characters"
            if not math.isfinite(value):
                return f"points[{i}].values.{key}: must be a finite number"
    for key, text in request.notes.items():
        if not _KEY.fullmatch(key):
            return f"notes: key {key[:70]!r} is not [A-Za-z][A-Za-z0-9_./-]*, at most 64 characters"
        if len(text) > MAX_NOTE_CHARS or "\0" in text:
            return f"notes.{key}: at most {MAX_NOTE_CHARS} characters, no NUL"
    return ""


class ReportBook:
    """ReportBook: every job's reports kept, by job id (see the module)."""

    def __init__(self) -> None:
        self._jobs: dict[str, JobReports] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def load(self, rows: Iterable[Mapping[str, Any]]) -> None:
        self._jobs = {row["job_id"]: reports_from(row) for row in rows}

    def of(self, job_id: str) -> JobReports | None:
        return self._jobs.get(job_id)

    def lock(self, job_id: str) -> asyncio.Lock:
        """lock: held while one report of the job is made and stored."""
        return self._locks.setdefault(job_id, asyncio.Lock())

    def updated(self, job_id: str, request: arranger_pb2.ReportValuesRequest) -> JobReports | str:
        """updated: the job's reports with the request's (checked by `problem`) added, not
        yet kept; or why not (its keys or notes would pass their limits)."""
        now = self._jobs.get(job_id)
        new = now.copy() if now is not None else JobReports()
        for point in request.points:  # in the order sent: a lower step rewinds (see Series)
            for key, value in point.values.items():
                if key not in new.series and len(new.series) >= MAX_KEYS:
                    return f"points: a job reports at most {MAX_KEYS} keys; {key!r} would pass it"
                new.series.setdefault(key, Series()).add(point.step, value)
            new.step = point.step  # the latest report's, whatever its step
        new.notes.update(request.notes)
        if len(new.notes) > MAX_NOTES:
            return f"notes: a job publishes at most {MAX_NOTES} notes"
        return new

    def put(self, job_id: str, reports: JobReports) -> None:
        """put keeps a job's reports, once stored."""
        self._jobs[job_id] = reports

    def forget(self, job_ids: Iterable[str]) -> None:
        """forget: these jobs have left the store (their rows went with them)."""
        for job_id in job_ids:
            self._jobs.pop(job_id, None)
            lock = self._locks.get(job_id)
            if lock is not None and not lock.locked():
                del self._locks[job_id]

    def release(self, job_id: str) -> None:
        """release drops the job's lock once no report waits on it."""
        lock = self._locks.get(job_id)
        if lock is not None and not lock.locked():
            del self._locks[job_id]


def series_to_proto(reports: JobReports, keys: Iterable[str] = ()) -> list[job_pb2.ReportSeries]:
    """series_to_proto: the job's series of these keys (none: every key), by key."""
    wanted = set(keys)
    return [
        job_pb2.ReportSeries(key=key, steps=s.steps, values=s.values)
        for key, s in sorted(reports.series.items())
        if not wanted or key in wanted
    ]
