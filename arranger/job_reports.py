"""job_reports: what a job's programs report through the in-job SDK (arranger.job), kept until
sent, and what they read of their experiment.

`Pending` holds the points and notes not sent yet, bounded; `checked_point` and `checked_notes`
refuse at once what the server never takes (its rules, as arranger.server.reports has them);
`Peer` and `Experiment` are the experiment as GetExperiment answers it. Only the standard
library and the generated messages are imported.
"""

from __future__ import annotations

import math
import operator
import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from arranger.v1 import arranger_pb2, job_pb2

MAX_PENDING_POINTS = 10_000  # kept while the server cannot take them; the oldest go first
POINTS_PER_CALL = 1000  # the server takes at most this many points in one call
MAX_NOTE_CHARS = 1024  # the server keeps a note of at most this many characters
MAX_KEYS = 64  # the server keeps at most this many keys of one job
MAX_NOTES = 16  # ... and this many notes
KEY = re.compile(r"[A-Za-z][A-Za-z0-9_./-]{0,63}")  # a reported key or a note's, as the server's
KEY_RULE = "[A-Za-z][A-Za-z0-9_./-]*, at most 64 characters"


@dataclass(frozen=True)
class Peer:
    """Peer: one member of an experiment as the server knows it now: its sweep `values`
    (`seed` among them), its stage and outcome (as `arranger list` shows them), the step of
    its latest report (0: none yet), its latest reported value of each key, and the latest
    text of each note it published."""

    name: str
    id: str
    index: int
    values: dict[str, str]
    stage: str
    outcome: str = ""
    step: int = 0
    latest: dict[str, float] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    exit_code: int | None = None  # its leader's last


@dataclass(frozen=True)
class Experiment:
    """Experiment: the sweep a job is a member of, and its members (by index; deleted ones
    left out)."""

    name: str
    id: str
    parameters: tuple[str, ...]
    members: tuple[Peer, ...]


def experiment_of(msg: job_pb2.Experiment) -> Experiment:
    """experiment_of: the experiment as the server answered it."""
    peers = tuple(
        Peer(
            name=m.job.name,
            id=m.job.id,
            index=m.index,
            values=dict(m.values),
            stage=m.job.progress.stage,
            outcome=m.job.progress.outcome,
            step=m.step,
            latest=dict(m.latest),
            notes=dict(m.notes),
            exit_code=m.exit_code if m.HasField("exit_code") else None,
        )
        for m in sorted(msg.members, key=lambda m: m.index)
    )
    s = msg.summary
    return Experiment(s.name, s.id, tuple(s.parameters), peers)


def checked_point(step: int, values: Mapping[str, float]) -> tuple[int, dict[str, float]]:
    """checked_point: a step and its values as the server takes them (a step >= 0, keys as
    KEY, finite numbers), or ValueError naming what is not."""
    at = operator.index(step)
    if at < 0:
        raise ValueError(f"step: must be >= 0, not {at}")
    point: dict[str, float] = {}
    for key, value in values.items():
        if not KEY.fullmatch(key):
            raise ValueError(f"key {key[:70]!r}: must be {KEY_RULE}")
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"{key}: must be a finite number, not {number}")
        point[key] = number
    return at, point


def checked_notes(notes: Mapping[str, str]) -> dict[str, str]:
    """checked_notes: notes as the server takes them (keys as KEY, texts of at most
    MAX_NOTE_CHARS, no NUL), or ValueError naming what is not."""
    for key, text in notes.items():
        if not KEY.fullmatch(key):
            raise ValueError(f"note {key[:70]!r}: must be {KEY_RULE}")
        if not isinstance(text, str) or len(text) > MAX_NOTE_CHARS or "\0" in text:
            raise ValueError(
                f"note {key}: must be text of at most {MAX_NOTE_CHARS} characters, no NUL"
            )
    return dict(notes)


class Pending:
    """Pending: the points and notes a job has yet to send, in the order they were reported
    (a point of the same step as the one before it joins it), and the keys reported and the
    notes published so far.
    At most `most` points are kept: past that the oldest are dropped, and counted in
    `dropped`. Not thread-safe: the job holds its lock around it."""

    def __init__(self, most: int = MAX_PENDING_POINTS) -> None:
        self.points: deque[tuple[int, dict[str, float]]] = deque()
        self.notes: dict[str, str] = {}
        self.keys: set[str] = set()
        self.note_keys: set[str] = set()
        self.dropped = 0
        self.most = most

    def add(self, step: int, values: dict[str, float]) -> None:
        """add queues a point; one that would take the keys past MAX_KEYS is refused
        (ValueError) before the server would refuse it with every point sent along."""
        new = values.keys() - self.keys
        if len(self.keys) + len(new) > MAX_KEYS:
            raise ValueError(
                f"a job reports at most {MAX_KEYS} keys; {sorted(new)[0]!r} would pass it"
            )
        self.keys.update(new)
        if self.points and self.points[-1][0] == step:
            self.points[-1][1].update(values)
        else:
            self.points.append((step, values))
        self._bound()

    def note(self, notes: dict[str, str]) -> None:
        """note sets texts to send; one that would take the notes past MAX_NOTES is refused
        (ValueError), as `add` refuses keys."""
        new = notes.keys() - self.note_keys
        if len(self.note_keys) + len(new) > MAX_NOTES:
            raise ValueError(
                f"a job publishes at most {MAX_NOTES} notes; {sorted(new)[0]!r} would pass it"
            )
        self.note_keys.update(new)
        self.notes.update(notes)

    def take(self, most: int) -> tuple[list[tuple[int, dict[str, float]]], dict[str, str]]:
        """take: the oldest points, at most `most` and up to a step below the one before it
        (the server orders one call's points by step, so a learner that went back must be
        told in a call of its own), and every note, no longer pending."""
        points: list[tuple[int, dict[str, float]]] = []
        while self.points and len(points) < most:
            if points and self.points[0][0] < points[-1][0]:
                break
            points.append(self.points.popleft())
        notes, self.notes = self.notes, {}
        return points, notes

    def give_back(self, points: list[tuple[int, dict[str, float]]], notes: dict[str, str]) -> None:
        """give_back makes what `take` took pending again, before what came since (a note set
        since is newer, and kept)."""
        self.points.extendleft(reversed(points))
        self.notes = {**notes, **self.notes}
        self._bound()

    def _bound(self) -> None:
        while len(self.points) > self.most:
            self.points.popleft()
            self.dropped += 1


def report_request(
    job_id: str, points: list[tuple[int, dict[str, float]]], notes: dict[str, str]
) -> arranger_pb2.ReportValuesRequest:
    return arranger_pb2.ReportValuesRequest(
        job=job_id,
        points=[arranger_pb2.ReportPoint(step=step, values=values) for step, values in points],
        notes=notes,
    )
