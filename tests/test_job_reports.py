"""The in-job SDK's reports before they are sent (arranger.job_reports, arranger.job): what
is refused at once, what is kept while the server cannot take it and in what order, and the
experiment as a program reads it. No server: the end-to-end tests are in
tests/e2e/test_job_reports.py."""

from __future__ import annotations

import logging

import grpc
import numpy as np
import pytest

from arranger.job import Job
from arranger.job_reports import (
    KEY,
    MAX_KEYS,
    MAX_NOTE_CHARS,
    MAX_NOTES,
    POINTS_PER_CALL,
    Peer,
    Pending,
    checked_notes,
    checked_point,
    experiment_of,
)
from arranger.server import reports
from arranger.v1 import arranger_pb2, job_pb2

NOWHERE = "127.0.0.1:1"  # nothing listens there: every call is UNAVAILABLE at once


def test_the_sdk_holds_the_servers_rules() -> None:
    assert KEY.pattern == reports._KEY.pattern
    assert (MAX_KEYS, MAX_NOTES, MAX_NOTE_CHARS, POINTS_PER_CALL) == (
        reports.MAX_KEYS,
        reports.MAX_NOTES,
        reports.MAX_NOTE_CHARS,
        reports.MAX_POINTS_PER_CALL,
    )


def test_what_the_server_never_takes_is_refused_at_once() -> None:
    assert checked_point(np.int64(3), {"loss": np.float32(0.5), "a/b.c-d_e": 1}) == (
        3,
        {"loss": 0.5, "a/b.c-d_e": 1.0},
    )
    for step, values, why in (
        (-1, {"x": 1.0}, "step: must be >= 0"),
        (1, {"1x": 1.0}, "key '1x': must be [A-Za-z]"),
        (1, {"x" * 65: 1.0}, "at most 64 characters"),
        (1, {"x": float("nan")}, "x: must be a finite number"),
        (1, {"x": float("inf")}, "x: must be a finite number"),
    ):
        with pytest.raises(ValueError, match=why.replace("[", r"\[")):
            checked_point(step, values)
    with pytest.raises(TypeError):
        checked_point(1.5, {"x": 1.0})  # type: ignore[arg-type]
    assert checked_notes({"checkpoint": "/c/1"}) == {"checkpoint": "/c/1"}
    for notes in ({"checkpoint": "x" * 1025}, {"checkpoint": "a\0b"}, {"-": "x"}):
        with pytest.raises(ValueError, match="note"):
            checked_notes(notes)


def test_pending_keeps_the_newest_points_and_counts_the_dropped() -> None:
    pending = Pending(most=3)
    for step in range(5):
        pending.add(step, {"x": float(step)})
    assert [s for s, _ in pending.points] == [2, 3, 4] and pending.dropped == 2
    pending.add(4, {"y": 1.0})  # the same step as the last: one point
    assert list(pending.points)[-1] == (4, {"x": 4.0, "y": 1.0}) and pending.dropped == 2


def test_points_given_back_go_before_newer_ones_and_newer_notes_win() -> None:
    pending = Pending(most=4)
    for step in range(3):
        pending.add(step, {"x": float(step)})
    pending.notes["checkpoint"] = "/c/2"
    points, notes = pending.take(2)
    assert [s for s, _ in points] == [0, 1] and notes == {"checkpoint": "/c/2"}
    assert [s for s, _ in pending.points] == [2] and pending.notes == {}
    pending.add(3, {"x": 3.0})
    pending.add(4, {"x": 4.0})
    pending.notes["checkpoint"] = "/c/4"
    pending.give_back(points, notes)  # the send failed: in order again, the oldest dropped
    assert [s for s, _ in pending.points] == [1, 2, 3, 4] and pending.dropped == 1
    assert pending.notes == {"checkpoint": "/c/4"}


def test_a_step_back_starts_a_send_of_its_own() -> None:
    """A learner that went back (it resumed from an earlier checkpoint) tells the server in
    a call of its own: the server orders one call's points by step."""
    pending = Pending()
    for step in (10, 11, 12, 5, 6, 7, 3):
        pending.add(step, {"x": float(step)})
    sends = []
    while pending.points:
        sends.append([s for s, _ in pending.take(POINTS_PER_CALL)[0]])
    assert sends == [[10, 11, 12], [5, 6, 7], [3]]
    for step in range(5):
        pending.add(step, {"x": 1.0})
    assert [s for s, _ in pending.take(3)[0]] == [0, 1, 2]


def test_a_key_past_the_limit_is_refused_and_queues_nothing() -> None:
    pending = Pending()
    pending.add(0, {f"k{i}": 1.0 for i in range(MAX_KEYS - 1)})
    pending.add(1, {"k0": 2.0, "last": 1.0})  # the 64th
    with pytest.raises(ValueError, match="at most 64 keys; 'more' would pass it"):
        pending.add(2, {"k1": 3.0, "more": 1.0})
    assert [s for s, _ in pending.points] == [0, 1] and len(pending.keys) == MAX_KEYS
    for i in range(MAX_NOTES):
        pending.note({f"n{i}": "text", "n0": "again"})
    with pytest.raises(ValueError, match="at most 16 notes; 'n16' would pass it"):
        pending.note({"n16": "text"})
    assert len(pending.notes) == MAX_NOTES and pending.notes["n0"] == "again"


def test_the_experiment_is_read_by_index() -> None:
    msg = job_pb2.Experiment(
        summary=job_pb2.ExperimentSummary(name="e", id="e1", parameters=["lr"])
    )
    second = msg.members.add(index=1, values={"lr": "2", "seed": "0"}, step=7, exit_code=0)
    second.job.name, second.job.id, second.job.progress.stage = "e-1", "j1", "Succeeded"
    second.job.progress.outcome = "Completed"
    second.latest["loss"] = 0.5
    second.notes["checkpoint"] = "/c/1"
    first = msg.members.add(index=0, values={"lr": "1", "seed": "0"})
    first.job.name, first.job.id, first.job.progress.stage = "e-0", "j0", "Running"
    exp = experiment_of(msg)
    assert (exp.name, exp.id, exp.parameters) == ("e", "e1", ("lr",))
    assert exp.members == (
        Peer("e-0", "j0", 0, {"lr": "1", "seed": "0"}, "Running"),
        Peer(
            "e-1", "j1", 1, {"lr": "2", "seed": "0"}, "Succeeded", "Completed",
            step=7, latest={"loss": 0.5}, notes={"checkpoint": "/c/1"}, exit_code=0,
        ),
    )  # fmt: skip


def test_a_failed_flush_keeps_the_points_and_close_counts_what_it_could_not_send(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with pytest.raises(ValueError, match="report_interval_s"):
        Job(NOWHERE, "arj_x_y", "x", report_interval_s=0)
    job = Job(NOWHERE, "arj_x_y", "x", report_interval_s=3600)
    job.flush()  # nothing to send: no call made
    job.report(1, x=1.0)
    job.report(2, x=2.0)
    with pytest.raises(grpc.RpcError) as failed:
        job.flush(timeout_s=5)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert job.reports_dropped == 0  # kept for the next send
    with caplog.at_level(logging.WARNING, "arranger.job"):
        job.close()
    assert job.reports_dropped == 2
    assert "2 reported points not sent" in caplog.text
    with pytest.raises(ValueError, match="closed"):
        job.report(3, x=3.0)
    job.close()  # again: nothing more


class Unavailable(grpc.RpcError):
    """Unavailable: the server is away (failing over to a standby)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "failing over"


def test_a_heartbeat_is_kept_through_a_send_the_server_may_get_over() -> None:
    """A send that fails with a failure the server may get over (UNAVAILABLE) gives back its
    points and its heartbeat: the next send says the pod progresses, once."""
    sent: list[arranger_pb2.ReportValuesRequest] = []
    failures = [Unavailable()]

    def unary(method: str, request: object, timeout_s: float, answer: type) -> object:
        if failures:
            raise failures.pop()
        sent.append(request)  # type: ignore[arg-type]
        return answer()

    job = Job(NOWHERE, "arr_token", "job-1", report_interval_s=3600, pod="rl-learner")
    job._unary = unary  # type: ignore[method-assign,assignment]
    try:
        job.heartbeat()
        job.heartbeat()
        with pytest.raises(grpc.RpcError):
            job._send(5.0)
        job._send(5.0)
        job._send(5.0)  # nothing more to say
        assert [(r.pod, len(r.points)) for r in sent] == [("rl-learner", 0)]
    finally:
        job.close()
