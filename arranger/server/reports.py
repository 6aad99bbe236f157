"""reports: the scalars a job's pods report (the in-job SDK's `job.report(step, **values)`),
and the texts they publish (`job.publish(checkpoint=...)`), as the server keeps them.

Each job keeps, per key, its latest value and a bounded history: at most MAX_POINTS points,
steps ascending; when it is full, every other point but the newest is dropped (the history
keeps its span at half the resolution, so a long run is seen whole, coarser the older it is).
A step below the newest (a learner restarted from an earlier checkpoint) drops the points
from that step on: the history is the run as it now stands. Each job has at most MAX_KEYS keys
and MAX_NOTES notes, and its reports count against its owner's limits.jobBytesPerUser at
POINT_BYTES a point (`JobReports.size`): a user's reports are bounded as the rest of what the
store keeps for them.

A report is kept in memory only once stored (copy on write: `updated` makes the new state,
`put` installs it after its write), so memory never runs ahead of the store; the reports of
one job are taken one at a time (`lock`). What a report writes is what it changed
(`ReportChange`: the points added or changed, those thinned or rewound away, the notes): a
write costs the points reported, not the history kept.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from arranger.v1 import arranger_pb2, job_pb2

MAX_KEYS = 64  # reported keys of one job
MAX_POINTS = 256  # kept points of one key
MAX_NOTES = 16  # published texts of one job
MAX_NOTE_CHARS = 1024
MAX_POINTS_PER_CALL = 1000
POINT_BYTES = 64  # a stored point with its index entry, about, as jobBytesPerUser counts it
REPLY_POINTS = 200_000  # the most points one GetReports reply holds (thinned evenly)
_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_./-]{0,63}")
_KEY_RULE = "is not [A-Za-z][A-Za-z0-9_./-]*, at most 64 characters"


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
    """JobReports: one job's kept series by key, its notes, and its newest kept point's
    step."""

    series: dict[str, Series] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    step: int = 0

    def latest(self) -> dict[str, float]:
        """latest: each key's newest value."""
        return {key: s.values[-1] for key, s in self.series.items() if s.values}

    def copy(self) -> JobReports:
        series = {k: Series(list(s.steps), list(s.values)) for k, s in self.series.items()}
        return JobReports(series, dict(self.notes), self.step)

    def size(self) -> int:
        """size: the bytes its rows take in the store, about (see POINT_BYTES)."""
        points = sum(len(s.steps) for s in self.series.values())
        notes = sum(len(k) + len(t.encode()) + POINT_BYTES for k, t in self.notes.items())
        return points * POINT_BYTES + notes


@dataclass(frozen=True)
class ReportChange:
    """ReportChange: what one report changed of a job's stored rows: points written (key,
    step, value: new, or a step reported again), points gone (key, step: thinned, rewound),
    notes written (key, text)."""

    points: tuple[tuple[str, int, float], ...] = ()
    gone: tuple[tuple[str, int], ...] = ()
    notes: tuple[tuple[str, str], ...] = ()


def change_of(
    before: JobReports | None, after: JobReports, notes: Mapping[str, str]
) -> ReportChange:
    """change_of: the rows that differ between a job's reports before and after a report that
    published `notes` (a key the report did not touch is the same object's copy: equal)."""
    points: list[tuple[str, int, float]] = []
    gone: list[tuple[str, int]] = []
    for key, series in after.series.items():
        old = before.series.get(key) if before is not None else None
        if old is not None and old.steps == series.steps and old.values == series.values:
            continue
        had = dict(zip(old.steps, old.values, strict=True)) if old is not None else {}
        now = dict(zip(series.steps, series.values, strict=True))
        points += [(key, step, value) for step, value in now.items() if had.get(step) != value]
        gone += [(key, step) for step in had if step not in now]
    return ReportChange(tuple(points), tuple(gone), tuple(sorted(notes.items())))


def reports_of(
    points: Iterable[Mapping[str, Any]], notes: Iterable[Mapping[str, Any]]
) -> dict[str, JobReports]:
    """reports_of: every job's reports as stored: its points (read by job, key and step) and
    notes. A job's step is its newest point's (a rewind removed those after it)."""
    found: dict[str, JobReports] = {}
    for row in points:
        reports = found.setdefault(row["job_id"], JobReports())
        series = reports.series.setdefault(row["key"], Series())
        series.steps.append(int(row["step"]))
        series.values.append(float(row["value"]))
        reports.step = max(reports.step, int(row["step"]))
    for row in notes:
        found.setdefault(row["job_id"], JobReports()).notes[row["key"]] = row["text"]
    return found


def problem(request: arranger_pb2.ReportValuesRequest) -> str:
    """problem: why a report is refused, naming the field ("" if it is not)."""
    if len(request.points) > MAX_POINTS_PER_CALL:
        return f"points: at most {MAX_POINTS_PER_CALL} a call"
    for i, point in enumerate(request.points):
        if point.step < 0:
            return f"points[{i}].step: must be >= 0"
        for key, value in point.values.items():
            if not _KEY.fullmatch(key):
                return f"points[{i}].values: key {key[:70]!r} {_KEY_RULE}"
            if not math.isfinite(value):
                return f"points[{i}].values.{key}: must be a finite number"
    for key, text in request.notes.items():
        if not _KEY.fullmatch(key):
            return f"notes: key {key[:70]!r} {_KEY_RULE}"
        if len(text) > MAX_NOTE_CHARS or "\0" in text:
            return f"notes.{key}: at most {MAX_NOTE_CHARS} characters, no NUL"
    return ""


class ReportBook:
    """ReportBook: every job's reports kept, by job id (see the module)."""

    def __init__(self) -> None:
        self._jobs: dict[str, JobReports] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def load(self, jobs: dict[str, JobReports]) -> None:
        self._jobs = jobs

    def sizes(self) -> list[tuple[str, int]]:
        """sizes: each job's reports' bytes in the store (see JobReports.size)."""
        return [(job_id, reports.size()) for job_id, reports in self._jobs.items()]

    def of(self, job_id: str) -> JobReports | None:
        return self._jobs.get(job_id)

    def lock(self, job_id: str) -> asyncio.Lock:
        """lock: held while one report of the job is made and stored (kept while the job is:
        a lock dropped while a report waits on it would let the next run beside it)."""
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
        # Its newest point's step, as a restart reads it back (a point without values, or a
        # lower step of another key, changes nothing kept).
        new.step = max((s.steps[-1] for s in new.series.values() if s.steps), default=0)
        new.notes.update(request.notes)
        if len(new.notes) > MAX_NOTES:
            return f"notes: a job publishes at most {MAX_NOTES} notes"
        return new

    def put(self, job_id: str, reports: JobReports) -> None:
        """put keeps a job's reports, once stored."""
        self._jobs[job_id] = reports

    def forget(self, job_ids: Iterable[str]) -> None:
        """forget: these jobs have left the store (their rows went with them), and their
        locks go (a report still waiting on one finds its job gone, and is refused)."""
        for job_id in job_ids:
            self._jobs.pop(job_id, None)
            self._locks.pop(job_id, None)


def series_to_proto(
    reports: JobReports, keys: Iterable[str] = (), keep: int = MAX_POINTS
) -> list[job_pb2.ReportSeries]:
    """series_to_proto: the job's series of these keys (none: every key), by key, each
    thinned evenly to `keep` points (2 or more; its first and newest kept)."""
    wanted = set(keys)
    found = []
    for key, s in sorted(reports.series.items()):
        if not wanted or key in wanted:
            steps, values = thin(s.steps, s.values, keep)
            found.append(job_pb2.ReportSeries(key=key, steps=steps, values=values))
    return found


def thin(steps: Sequence[int], values: Sequence[float], keep: int) -> tuple[list[int], list[float]]:
    """thin: at most `keep` (2 or more) of the points, evenly spread, the first and the last
    among them."""
    n = len(steps)
    if n <= keep:
        return list(steps), list(values)
    chosen = sorted({round(i * (n - 1) / (keep - 1)) for i in range(keep)})
    return [steps[i] for i in chosen], [values[i] for i in chosen]
