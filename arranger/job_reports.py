"""job_reports: what a job's programs report through the in-job SDK (arranger.job), kept until
sent, how it is sent, and what they read of their experiment.

`Pending` holds the points and notes not sent yet, bounded; `checked_point` and `checked_notes`
refuse at once what the server never takes (its rules, as arranger.server.reports has them);
`Peer` and `Experiment` are the experiment as GetExperiment answers it. `Reporting` is the Job's
side of it (arranger.job.Job inherits it): report, publish, flush and the reporting thread,
experiment and peers. Only the standard library, gRPC and the generated messages are imported.
"""

from __future__ import annotations

import atexit
import logging
import math
import operator
import re
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import grpc

from arranger.v1 import arranger_pb2, job_pb2

MAX_PENDING_POINTS = 10_000  # kept while the server cannot take them; the oldest go first
POINTS_PER_CALL = 1000  # the server takes at most this many points in one call
MAX_NOTE_CHARS = 1024  # the server keeps a note of at most this many characters
MAX_KEYS = 64  # the server keeps at most this many keys of one job
MAX_NOTES = 16  # ... and this many notes
KEY = re.compile(r"[A-Za-z][A-Za-z0-9_./-]{0,63}")  # a reported key or a note's, as the server's
KEY_RULE = "[A-Za-z][A-Za-z0-9_./-]*, at most 64 characters"
# Failures the server may get over: it went away, is restarting or is not the active one. A
# send keeps its points for the next; a subscription (arranger.job) opens its stream again.
RETRIED = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,  # a server that hangs (powered off, cut off)
    }
)
REPORT_INTERVAL_S = 1.0  # the least time between two sends of the reporting thread
REPORT_TRY_S = 10.0  # one send of the reporting thread, failover included
CLOSE_TRY_S = 10.0  # the last send, at close or at the program's exit

log = logging.getLogger("arranger.job")
Reply = TypeVar("Reply")


class NotInExperiment(RuntimeError):
    """NotInExperiment: the job is no member of an experiment (it was not submitted with a
    sweep), so it has no peers."""


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
    job_id: str, points: list[tuple[int, dict[str, float]]], notes: dict[str, str], pod: str = ""
) -> arranger_pb2.ReportValuesRequest:
    return arranger_pb2.ReportValuesRequest(
        job=job_id,
        points=[arranger_pb2.ReportPoint(step=step, values=values) for step, values in points],
        notes=notes,
        pod=pod,
    )


class Reporting:
    """Reporting: a job's reports and what it reads of its experiment, the part of
    arranger.job.Job that sends and reads them (see arranger.job's docstring). Points and
    notes wait in a `Pending` until a thread of the job's own, started by the first of them,
    sends them; `_end_reports` sends the rest when the job closes.
    Job gives it `id`, `_closed` (set when the job closes) and the calls `_unary` (with
    failover) and `get`."""

    id: str
    pod: str
    _closed: threading.Event

    def __init__(self, experiment: str, report_interval_s: float) -> None:
        self._experiment = experiment
        if not report_interval_s > 0:
            raise ValueError(f"report_interval_s: must be > 0, not {report_interval_s}")
        self.report_interval_s = report_interval_s
        self._pending = Pending()
        self._holding = threading.Lock()  # around _pending and _refused
        self._sending = threading.Lock()  # one send at a time, so points go in order
        self._refused: grpc.RpcError | None = None  # the first refusal since the last flush
        self._reporter: threading.Thread | None = None
        self._beat = False  # progress to say with the next send, values or none

    def _unary(self, method: str, request: object, timeout_s: float, answer: type[Reply]) -> Reply:
        raise NotImplementedError  # the Job's

    def get(self, timeout_s: float = 30.0) -> job_pb2.TYJob:
        raise NotImplementedError  # the Job's

    def report(self, step: int, **values: float) -> None:
        """report queues the values (numbers, by key) the job has at `step` (a training step,
        an iteration: any count that grows), to be sent with the next send (see arranger.job).
        A key must be as job_reports.KEY has it, and one of at most MAX_KEYS (64) this
        program reports; a value, a finite number; the step, >= 0: else ValueError, at once.
        A step below the one before means the learner went back (it resumed from an earlier
        checkpoint): it is sent in a call of its own, and the server drops the points from
        that step on."""
        point = checked_point(step, values)
        with self._holding:
            self._live()
            self._pending.add(*point)

    def heartbeat(self) -> None:
        """heartbeat says the pod makes progress (see progressTimeoutSeconds) without a value to
        report: sent with the next send (see arranger.job), one call however many beats.
        Reports are progress too. Cheap enough for every step of a loop."""
        with self._holding:
            self._live()
            self._beat = True

    def publish(self, **notes: str) -> None:
        """publish sets texts the server keeps the latest of, such as where the latest
        checkpoint is: `job.publish(checkpoint=path)`. They are sent with the next send (see
        arranger.job). A key must be as job_reports.KEY has it, and one of at most MAX_NOTES
        (16) this program publishes; a text, of at most 1,024 characters without NUL: else
        ValueError, at once."""
        texts = checked_notes(notes)
        with self._holding:
            self._live()
            self._pending.note(texts)

    @property
    def reports_dropped(self) -> int:
        """reports_dropped: how many reported points were never sent: the oldest past
        MAX_PENDING_POINTS while the server could not take them, and those it refused."""
        with self._holding:
            return self._pending.dropped

    def flush(self, timeout_s: float = 30.0) -> None:
        """flush sends every point and note reported so far, now. It raises the first
        refusal since the last flush (grpc.RpcError), met here or by the reporting thread,
        and a send that failed within `timeout_s` (its points kept for the next)."""
        with self._holding:
            if self._closed.is_set():
                raise ValueError("the job is closed")
        self._send(timeout_s)
        with self._holding:
            refused, self._refused = self._refused, None
        if refused is not None:
            raise refused

    def _live(self) -> None:
        """_live checks the job is open and starts its reporting thread, if not yet (held:
        _holding)."""
        if self._closed.is_set():
            raise ValueError("the job is closed")
        if self._reporter is None:
            self._reporter = threading.Thread(target=self._report_loop, daemon=True)
            self._reporter.start()
            atexit.register(self._last_send)  # a program that ends without close()

    def _report_loop(self) -> None:
        """_report_loop sends what is pending every report_interval_s until the job closes
        (failures are kept for `flush` to raise)."""
        while not self._closed.wait(self.report_interval_s):
            try:
                self._send(REPORT_TRY_S)
            except grpc.RpcError:
                pass  # kept for the next send, or dropped and kept for flush to raise
            except ValueError:  # the channel closed under it
                return

    def _last_send(self) -> None:
        """_last_send: what is left, at close or exit; logged, never raised."""
        try:
            self._send(CLOSE_TRY_S)
        except (grpc.RpcError, ValueError) as exc:
            with self._holding:
                lost = len(self._pending.points)
                self._pending.dropped += lost
                self._pending.points.clear()
            log.warning("arranger.job: %d reported points not sent: %s", lost, exc)

    def _send(self, timeout_s: float) -> None:
        """_send sends what is pending, POINTS_PER_CALL points a call, within `timeout_s`
        (what is still pending then is left for the next send).
        A failure the server may get over (RETRIED) gives the points back, oldest first; a
        refusal drops them (counted) and is kept for `flush`. Either is raised."""
        deadline = time.monotonic() + timeout_s
        with self._sending:
            while True:
                if time.monotonic() >= deadline:  # what a busy reporter adds meanwhile waits
                    return
                with self._holding:
                    points, notes = self._pending.take(POINTS_PER_CALL)
                    beat, self._beat = self._beat, False
                if not points and not notes and not (beat and self.pod):
                    return
                request = report_request(self.id, points, notes, self.pod)
                try:
                    left = max(deadline - time.monotonic(), 0.1)
                    self._unary("ReportValues", request, left, arranger_pb2.ReportValuesResponse)
                except grpc.RpcError as exc:
                    with self._holding:
                        if exc.code() in RETRIED:
                            self._pending.give_back(points, notes)
                            self._beat = self._beat or beat  # said with the next send
                        else:
                            self._pending.dropped += len(points)
                            if self._refused is None:
                                self._refused = exc
                            log.warning("arranger.job: report refused: %s", exc.details())
                    raise

    def experiment(self, timeout_s: float = 30.0) -> Experiment:
        """experiment: the experiment (sweep) this job is a member of, and each member's
        values, stage and latest reports, as the server knows them now (what the reporting
        thread has not sent yet is not there: `flush` first to see this job's own).
        NotInExperiment if the job is no member."""
        name = self._experiment_name(timeout_s)
        request = arranger_pb2.GetExperimentRequest(name=name)
        return experiment_of(self._unary("GetExperiment", request, timeout_s, job_pb2.Experiment))

    def peers(self, timeout_s: float = 30.0) -> list[Peer]:
        """peers: the experiment's members but this job, by index."""
        return [p for p in self.experiment(timeout_s).members if p.id != self.id]

    def _experiment_name(self, timeout_s: float) -> str:
        if not self._experiment:
            job = self.get(timeout_s)
            if job.spec.sweep.HasField("member"):
                self._experiment = job.metadata.name.removesuffix(f"-{job.spec.sweep.member}")
        if not self._experiment:
            raise NotInExperiment(f"job {self.id} is no member of an experiment (no sweep)")
        return self._experiment

    def _end_reports(self) -> None:
        """_end_reports: the last send, after a send of the reporting thread under way, at
        close (_closed set); see `_last_send`."""
        if self._reporter is not None:
            atexit.unregister(self._last_send)
            self._reporter.join()
            self._last_send()
