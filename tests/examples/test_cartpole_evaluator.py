"""The CartPole learner's side of its evaluator (a helper role): it serves it weights, logs its
scores and never learns from them; an evaluator that sends nonsense is dropped with a line
saying why, and the learner carries on. A socket pair stands for the connection."""

from __future__ import annotations

import io
import socket
import struct
import threading
import time

import pytest

from arranger.examples.cartpole import wire
from arranger.examples.cartpole.evaluator import run_evaluator
from arranger.examples.cartpole.learner import Learner, LearnerConfig


def serve_one(answer: bytes) -> tuple[list[BaseException], str, Learner]:
    """serve_one: one evaluator's hello and one answer (raw bytes) to a learner's handler."""
    out = io.StringIO()
    learner = Learner(LearnerConfig(), out)
    ours, theirs = socket.socketpair()
    escaped: list[BaseException] = []
    before = threading.excepthook
    threading.excepthook = lambda args: escaped.append(args.exc_value)  # type: ignore[assignment,misc]
    try:
        handler = threading.Thread(target=learner._handle, args=(theirs, ("10.0.0.9", 1)))
        handler.start()
        wire.send_msg(ours, {"rank": 6, "evaluates": True})
        assert wire.recv_msg(ours)["version"] == 0  # the weights
        ours.sendall(struct.pack(">I", len(answer)) + answer)
        if b'"evaluated": 195' in answer:  # a good answer: the next weights come
            assert wire.recv_msg(ours)["version"] == 0
        ours.close()
        handler.join(10)
        assert not handler.is_alive()
    finally:
        threading.excepthook = before
        ours.close()
    return escaped, out.getvalue(), learner


def test_an_evaluators_score_is_logged_and_never_learned_from() -> None:
    escaped, said, learner = serve_one(b'{"version": 0, "evaluated": 195.5}')
    assert not escaped and learner.version == 0 and learner.episodes == 0
    assert "learner: evaluator rank=6 connected" in said
    assert "learner: evaluator: version=0 eval_return=195.5" in said
    assert not learner._conns and not learner._evaluators


@pytest.mark.parametrize(
    "answer", [b'{"version": 1e400, "evaluated": 1}', b'{"version": "x", "evaluated": []}']
)
def test_an_evaluator_that_sends_nonsense_is_dropped_saying_why(answer: bytes) -> None:
    escaped, said, learner = serve_one(answer)
    assert not escaped, f"escaped the handler: {escaped!r}"
    assert "learner: dropping evaluator rank=6: bad message" in said
    assert not learner._conns and not learner._evaluators


def test_an_evaluator_started_after_its_learner_ended_ends_at_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The evaluator starts once the learner is ready (it listened): a refused connection
    means the learner has ended, so it ends at once (exit 0) instead of retrying until its
    set's terminationDelaySeconds stops it."""
    with socket.socket() as gone:
        gone.bind(("127.0.0.1", 0))
        port = gone.getsockname()[1]  # closed on leaving: nothing listens there
    started = time.monotonic()
    assert run_evaluator(f"127.0.0.1:{port}", 6, 1, 0.0, 60.0) == 0
    assert time.monotonic() - started < 5
    assert f"evaluator: the learner at 127.0.0.1:{port} has ended" in capsys.readouterr().out
