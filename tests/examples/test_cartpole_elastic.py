"""Tests of the CartPole learner's checkpoints, its scale rule, and its ways with actors that
leave: in process where that is enough, with real learner and actor processes for signals."""

from __future__ import annotations

import io
import json
import os
import queue
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from arranger.examples.cartpole import checkpoint, wire
from arranger.examples.cartpole.actor import batch_message, play_episode
from arranger.examples.cartpole.checkpoint import CheckpointError
from arranger.examples.cartpole.elastic import ScaleRule
from arranger.examples.cartpole.env import CartPole
from arranger.examples.cartpole.learner import Learner, LearnerConfig
from arranger.examples.cartpole.policy import PARAM_NAMES, from_wire
from tests.examples.test_cartpole import free_port, hard_timeout, spawn

# --- the scale rule ------------------------------------------------------------------


def test_the_rule_asks_for_one_more_actor_only_when_the_return_grew_slowly() -> None:
    rule = ScaleRule(every_updates=10, min_gain=5.0)
    assert rule.look(9, 20.0, wanted=2, connected=2, most=6) == 2  # too soon to look
    assert rule.look(10, 24.0, wanted=2, connected=2, most=6) == 2  # +24 since the start
    assert (rule.mark_version, rule.mark_average) == (10, 24.0)
    assert rule.look(20, 27.0, wanted=2, connected=2, most=6) == 3  # +3 < 5: slow
    assert rule.look(29, 27.0, wanted=3, connected=3, most=6) == 3  # the new actor's turn
    assert rule.look(30, 45.0, wanted=3, connected=3, most=6) == 3  # +18: fast enough
    assert rule.look(40, 46.0, wanted=3, connected=2, most=6) == 3  # one wanted is missing
    assert rule.look(50, 47.0, wanted=6, connected=6, most=6) == 6  # all maxCounts wanted
    assert rule.look(60, 48.0, wanted=5, connected=5, most=6) == 6
    assert rule.look(70, 30.0, wanted=4, connected=7, most=6) == 5  # a fall is slow too


# --- checkpoints ---------------------------------------------------------------------


def trained(config: LearnerConfig, batches: int, seed: int = 1) -> Learner:
    """trained: a learner that has applied `batches` batches of real episodes, not serving."""
    learner = Learner(config, out=io.StringIO())
    feed(learner, batches, seed)
    return learner


def feed(learner: Learner, batches: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    env = CartPole(rng)
    for _ in range(batches):
        state = learner.state()
        episodes = [play_episode(state.weights, env, rng) for _ in range(2)]
        learner._ingest(batch_message(state.version, episodes))


def test_a_checkpoint_round_trip_gives_back_the_same_learner(tmp_path: Path) -> None:
    config = LearnerConfig(target=1e9, window=6, checkpoint_dir=tmp_path, hidden=8)
    before = trained(config, batches=7)
    before.rule.mark_version, before.rule.mark_average = 5, 12.5
    assert before.save("test")

    after = Learner(config, out=io.StringIO())
    assert after.resume() and after.resumed_from == checkpoint.path_in(tmp_path)
    a, b = before.state(), after.state()
    assert (b.version, b.episodes, b.adam_t) == (a.version, a.episodes, a.adam_t) == (7, 14, 7)
    assert b.returns == a.returns and len(b.returns) == 6
    assert b.scale_mark == (5, 12.5)
    for name in PARAM_NAMES:
        for mine, theirs in ((a.weights, b.weights), (a.adam_m, b.adam_m), (a.adam_v, b.adam_v)):
            assert np.array_equal(mine[name], theirs[name]), name
    # The optimizer's state came back too: the same batch moves both alike.
    feed(before, 1, seed=9)
    feed(after, 1, seed=9)
    for name in PARAM_NAMES:
        assert np.array_equal(before.state().weights[name], after.state().weights[name])
    # The weights actors get are the resumed ones.
    assert np.array_equal(from_wire(after._wire_weights)["w1"], after.state().weights["w1"])


def test_a_failed_save_leaves_the_previous_checkpoint_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = LearnerConfig(checkpoint_dir=tmp_path, hidden=8)
    learner = trained(config, batches=2)
    assert learner.save("first")
    kept = checkpoint.path_in(tmp_path).read_bytes()
    feed(learner, 1, seed=2)

    def broken(body: object, f: io.TextIOBase, **_: object) -> None:
        f.write('{"format": 1, "weig')
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.json, "dump", broken)
    assert not learner.save("second")
    assert checkpoint.path_in(tmp_path).read_bytes() == kept
    assert [p.name for p in tmp_path.iterdir()] == [checkpoint.FILE_NAME]  # no temporary left


def test_a_checkpoint_of_another_shape_or_damaged_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert checkpoint.load(tmp_path, hidden=8) is None
    trained(LearnerConfig(checkpoint_dir=tmp_path, hidden=8), batches=1).save("test")
    with pytest.raises(CheckpointError, match="w1 has shape"):
        checkpoint.load(tmp_path, hidden=16)
    checkpoint.path_in(tmp_path).write_text('{"format": 1, "weights": ')
    with pytest.raises(CheckpointError):
        checkpoint.load(tmp_path, hidden=8)
    learner = Learner(LearnerConfig(checkpoint_dir=tmp_path, hidden=8), out=io.StringIO())
    assert not learner.resume() and learner.version == 0
    assert "learner: starting afresh: cannot resume from " in capsys.readouterr().err


# --- actors that leave ---------------------------------------------------------------


@hard_timeout(60)
def test_actors_that_leave_or_misbehave_do_not_stop_training() -> None:
    """A learner in this process: one actor says hello and hangs up, one sends garbage, one
    vanishes mid-batch; two real actor processes then train it to the target."""
    lines: queue.Queue[str] = queue.Queue()

    class Lines:
        def write(self, text: str) -> None:
            for line in text.splitlines():
                lines.put(line)

        def flush(self) -> None:
            pass

    learner = Learner(LearnerConfig(target=60, max_seconds=50), out=Lines())  # type: ignore[arg-type]
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    result: list[int] = []
    serving = threading.Thread(target=lambda: result.append(learner.serve(listener)))
    serving.start()
    actors: list[subprocess.Popen[str]] = []
    try:
        for rank, then in ((90, "hang up"), (91, "garbage"), (92, "half a batch")):
            with socket.create_connection(("127.0.0.1", port)) as fake:
                wire.send_msg(fake, {"rank": rank})
                wire.recv_msg(fake)  # weights
                if then == "garbage":
                    fake.sendall(wire.HEADER.pack(4) + b"[1]x")
                elif then == "half a batch":
                    fake.sendall(wire.HEADER.pack(1000) + b'{"version": 0')
            wait_line(lines, f"actor rank={rank}(: bad message| disconnected)")
        for rank in range(2):
            env = {"ARRANGER_LEADER_ADDR": f"127.0.0.1:{port}", "ARRANGER_WORKER_RANK": str(rank)}
            actors.append(spawn(["actor"], env))
        serving.join(55)
        assert result == [0]
        listener.close()  # as run_learner does: an actor still in the backlog sees the end too
        for actor in actors:
            assert actor.wait(30) == 0  # a deadline: on a loaded machine an actor starts slowly
    finally:
        learner.terminate(signal.SIGTERM)  # ends it if it is still serving
        serving.join(10)
        listener.close()
        for actor in actors:
            if actor.poll() is None:
                os.killpg(actor.pid, signal.SIGKILL)
            actor.communicate()


def wait_line(lines: queue.Queue[str], pattern: str, timeout_s: float = 20.0) -> str:
    """wait_line: the first line from `lines` that matches `pattern`, within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no line matching {pattern!r} within {timeout_s} s") from None
        if re.search(pattern, line):
            return line


def reader(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    """reader: the process's stdout, line by line, read on a thread of its own."""
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    stdout = proc.stdout

    def read() -> None:
        for line in stdout:
            lines.put(line.rstrip("\n"))

    threading.Thread(target=read, daemon=True).start()
    return lines


# --- SIGTERM, then resume, with real processes ---------------------------------------


@hard_timeout(120)
def test_sigterm_checkpoints_and_a_new_learner_resumes_there_and_solves(tmp_path: Path) -> None:
    """Standalone (no Arranger): the learner pauses after 6 updates, SIGTERM makes it save and
    exit 143; a learner started over the same directory resumes at version 6, trains to the
    target and removes the checkpoint."""
    procs: list[subprocess.Popen[str]] = []

    def start(*learner_args: str) -> tuple[subprocess.Popen[str], queue.Queue[str]]:
        port = free_port()
        learner = spawn(
            ["learner", "--target", "100", "--max-seconds", "90", *learner_args],
            {"ARRANGER_PORT_RPC": str(port), "ARRANGER_SCRATCH_DIR": str(tmp_path)},
        )
        procs.append(learner)
        for rank in range(2):
            env = {"ARRANGER_LEADER_ADDR": f"127.0.0.1:{port}", "ARRANGER_WORKER_RANK": str(rank)}
            procs.append(spawn(["actor"], env))
        return learner, reader(learner)

    try:
        first, lines = start("--pause-at-version", "6")
        wait_line(lines, r"no checkpoint in .*: starting afresh")
        wait_line(lines, r"paused at version=6")
        first.send_signal(signal.SIGTERM)
        wait_line(lines, r"SIGTERM: checkpointing and exiting")
        saved = wait_line(lines, r"checkpoint saved \(SIGTERM\)")
        assert "version=6 " in saved
        assert first.wait(20) == 128 + signal.SIGTERM
        assert json.loads(checkpoint.path_in(tmp_path).read_text())["version"] == 6

        # A resumed learner does not pause; the learner expands variables itself.
        second, lines = start(
            "--pause-at-version", "6", "--checkpoint-dir", "$ARRANGER_SCRATCH_DIR"
        )
        resumed = wait_line(lines, r"resumed from checkpoint")
        assert re.search(r"at version=6 episodes=\d+ ", resumed), resumed
        wait_line(lines, r"^solved: ", timeout_s=90)
        assert second.wait(20) == 0
        assert not checkpoint.path_in(tmp_path).exists()
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()  # learners' output is read by their reader threads
