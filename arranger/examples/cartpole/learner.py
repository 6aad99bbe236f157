"""learner: owns the policy, serves actors over TCP and stops once CartPole is solved.

One thread per actor connection sends the current weights, waits for a batch of
episodes and applies a policy-gradient step. A batch is usually stale by about one
version per other actor, since they update the weights while it is played; the learner
keeps recent versions' weights so the update can correct for that (see
PolicyGradient.gradient). An actor that goes away (it exits, is evicted, or its connection
breaks) only ends its own thread: the others train on, and one that connects later (an actor
placed again, or a new one) is served like the first. TCP keepalive drops a connection whose
actor vanished without closing it.

The main thread watches: for the solved event, the --max-seconds deadline, SIGTERM or
SIGINT, and, when Arranger runs the learner, the job's events and the scale rule (see
elastic). It then shuts every connection so actors see EOF and exit.

Checkpoints (see checkpoint) go to --checkpoint-dir, by default the pod's scratch directory
($ARRANGER_SCRATCH_DIR). The learner saves one when the job's eviction is announced (event
`job-evicting`; it then confirms with job.checkpointed(), so the eviction need not wait for
the notice to run out) and, as a fallback, when it ends unsolved: on SIGTERM (an eviction
without notice, `arranger stop`) or SIGINT, or at --max-seconds. At start it resumes from
the checkpoint there, if any, and says so; once solved it removes it.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from arranger.examples.cartpole import checkpoint, wire
from arranger.examples.cartpole.checkpoint import CheckpointError, LearnerState
from arranger.examples.cartpole.elastic import ArrangerLink, ScaleRule
from arranger.examples.cartpole.policy import (
    Episode,
    PolicyGradient,
    Weights,
    WireWeights,
    init_weights,
    to_wire,
)

ACCEPT_POLL_S = 0.2
TICK_S = 0.05  # how often the main thread looks at signals, the job's events and the rule
# Batches older than this many versions are too stale to learn from; their returns
# still count towards the average, since they were really played.
HISTORY_VERSIONS = 256
THREAD_JOIN_S = 2.0
# An actor silent this long is probed, and dropped after KEEPALIVE_PROBES unanswered probes.
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 10, 5, 3


@dataclass(frozen=True)
class LearnerConfig:
    """LearnerConfig holds the stopping rule (target, window, max_seconds), training knobs,
    where checkpoints go (None: nowhere), the scale rule's knobs (see elastic.ScaleRule) and
    `pause_at_version`: when > 0, a learner that did not resume from a checkpoint stops
    learning once that many updates are applied, parking its actors, until it is evicted
    or stopped (a fixed point at which to try eviction and resume)."""

    target: float = 195.0
    window: int = 20
    max_seconds: float = 110.0
    lr: float = 0.005
    hidden: int = 32
    seed: int = 0
    checkpoint_dir: Path | None = None
    actor_set: str = "actors"
    scale_every: int = 20
    scale_min_gain: float = 10.0
    pause_at_version: int = 0


class Learner:
    """Learner holds the policy, its version (number of updates applied) and the returns
    of the last `window` episodes; _lock guards all of them and the connection set. The
    scale rule and `_signal` belong to the main thread."""

    def __init__(self, config: LearnerConfig, out: TextIO = sys.stdout) -> None:
        self.config = config
        self._out = out
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._solved = False
        self._signal = 0  # set by the signal handler only: it must not take locks
        self._pg = PolicyGradient(
            init_weights(np.random.default_rng(config.seed), config.hidden), lr=config.lr
        )
        self.version = 0
        self.episodes = 0
        self._returns: deque[float] = deque(maxlen=config.window)
        self._seconds_before = 0.0  # trained by earlier runs, per the checkpoint
        self.resumed_from: Path | None = None
        self.rule = ScaleRule(config.scale_every, config.scale_min_gain)
        self._paused = False
        self._reset_history()
        self._conns: set[socket.socket] = set()
        self._evaluators: set[socket.socket] = set()  # of _conns: evaluators, not actors
        self._threads: list[threading.Thread] = []
        self._start = time.monotonic()

    def _reset_history(self) -> None:
        self._wire_weights: WireWeights = to_wire(self._pg.weights)
        # PolicyGradient.update replaces arrays rather than mutating them, so a shallow
        # copy per version is a snapshot.
        self._history: dict[int, Weights] = {self.version: dict(self._pg.weights)}

    # Checkpoints.

    def state(self) -> LearnerState:
        """state: a copy of everything a checkpoint keeps (call with _lock held, or before
        serving)."""
        pg = self._pg
        return LearnerState(
            weights=dict(pg.weights),
            adam_m=dict(pg.m),
            adam_v=dict(pg.v),
            adam_t=pg.t,
            version=self.version,
            episodes=self.episodes,
            returns=list(self._returns),
            seconds=self._seconds_before + time.monotonic() - self._start,
            scale_mark=(self.rule.mark_version, self.rule.mark_average),
        )

    def restore(self, state: LearnerState) -> None:
        """restore makes the learner what `state` says (before serving)."""
        pg = self._pg
        pg.weights, pg.m, pg.v, pg.t = (
            dict(state.weights),
            dict(state.adam_m),
            dict(state.adam_v),
            state.adam_t,
        )
        self.version, self.episodes = state.version, state.episodes
        self._returns.clear()
        self._returns.extend(state.returns)
        self._seconds_before = state.seconds
        self.rule.mark_version, self.rule.mark_average = state.scale_mark
        self._reset_history()

    def resume(self) -> bool:
        """resume restores the checkpoint in --checkpoint-dir, if there is a usable one, and
        says so; True when it did."""
        directory = self.config.checkpoint_dir
        if directory is None:
            return False
        try:
            state = checkpoint.load(directory, self.config.hidden)
        except CheckpointError as exc:
            self.log(f"learner: starting afresh: cannot resume from {exc}", sys.stderr)
            return False
        if state is None:
            self.log(f"learner: no checkpoint in {directory}: starting afresh")
            return False
        self.restore(state)
        self.resumed_from = checkpoint.path_in(directory)
        self.log(
            f"learner: resumed from checkpoint {self.resumed_from} at version={self.version} "
            f"episodes={self.episodes} avg_return={self._average():.1f} "
            f"trained_s={state.seconds:.1f}"
        )
        return True

    def save(self, why: str) -> bool:
        """save writes a checkpoint of the learner as it is now; True when one was written."""
        directory = self.config.checkpoint_dir
        if directory is None:
            return False
        started = time.monotonic()
        with self._lock:
            state = self.state()
        try:
            path = checkpoint.save(directory, state)
        except OSError as exc:
            self.log(f"learner: checkpoint ({why}) failed: {exc}", sys.stderr)
            return False
        ms = (time.monotonic() - started) * 1000
        self.log(
            f"learner: checkpoint saved ({why}) to {path} at version={state.version} "
            f"episodes={state.episodes} in {ms:.0f} ms"
        )
        return True

    # Serving.

    def terminate(self, signum: int, _frame: object = None) -> None:
        """terminate is the SIGTERM/SIGINT handler: the main thread then checkpoints and
        exits 128 + signum."""
        self._signal = signum

    def serve(self, listener: socket.socket, link: ArrangerLink | None = None) -> int:
        """serve accepts actors on listener until solved (returns 0), out of time (1) or
        signalled (128 + the signal). The reported seconds and the --max-seconds budget
        both count from this call."""
        self._start = time.monotonic()
        acceptor = threading.Thread(target=self._accept_loop, args=(listener,), daemon=True)
        acceptor.start()
        deadline = self._start + self.config.max_seconds
        while not self._done.wait(TICK_S):
            if self._signal or time.monotonic() >= deadline:
                break
            if link is not None:
                self._tend(link)
        self._done.set()
        if self._solved:
            if self.config.checkpoint_dir is not None:
                with contextlib.suppress(OSError):  # a leftover: a later run starts from here
                    checkpoint.remove(self.config.checkpoint_dir)
        elif self._signal:
            self.log(f"learner: {signal.Signals(self._signal).name}: checkpointing and exiting")
            self.save(signal.Signals(self._signal).name)
        else:
            self.save("out of time")
        with self._lock:
            avg, episodes = self._average(), self.episodes
            for conn in self._conns:
                # shutdown (not close) wakes the handler blocked in recv; it closes.
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        acceptor.join(THREAD_JOIN_S)
        for thread in list(self._threads):
            thread.join(THREAD_JOIN_S)
        if self._solved:
            return 0
        if self._signal:
            return 128 + self._signal
        self.log(
            f"learner: not solved within {self.config.max_seconds:g} s "
            f"(avg_return={avg:.1f} episodes={episodes}, target {self.config.target:g})",
            sys.stderr,
        )
        return 1

    def _tend(self, link: ArrangerLink) -> None:
        """_tend answers the job's events and applies the scale rule (main thread)."""
        events = link.poll()
        whole = any(e.kind == "job-evicting" for e in events)
        for event in events:
            who = event.member.name
            if event.kind == "job-evicting":
                self.log(f"learner: eviction notice: the job goes in {event.seconds_left:.1f} s")
                if self.save("eviction notice") and link.checkpointed():
                    self.log("learner: checkpoint confirmed; the eviction may go ahead")
            elif event.kind == "evicting" and not whole:  # else the same notice, told above
                self.log(f"learner: {who} is to be evicted in {event.seconds_left:.1f} s")
            elif event.kind == "lost":
                self.log(f"learner: {who} left: {event.member.state} {event.member.reason}")
        with self._lock:
            version, average = self.version, self._average()
            connected = len(self._conns) - len(self._evaluators)
        link.progress(version, average)  # its progress (progressTimeoutSeconds)
        wanted = self.rule.look(version, average, link.wanted, connected, link.most)
        if wanted > link.wanted:
            before = link.wanted
            if link.scale(wanted):
                self.log(
                    f"learner: avg_return={average:.1f} rose < {self.rule.min_gain:g} in "
                    f"{self.rule.every_updates} updates: actors {before} -> {link.wanted} "
                    f"(of {link.most})"
                )

    def _accept_loop(self, listener: socket.socket) -> None:
        """_accept_loop starts one handler thread per actor until the learner is done."""
        listener.settimeout(ACCEPT_POLL_S)
        while not self._done.is_set():
            try:
                conn, addr = listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _keepalive(conn)
            thread = threading.Thread(target=self._handle, args=(conn, addr), daemon=True)
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
            thread.start()

    def _handle(self, conn: socket.socket, addr: Any) -> None:
        """_handle runs the weights -> batch exchange with one actor until either side stops."""
        with self._lock:
            if self._done.is_set():
                conn.close()
                return
            self._conns.add(conn)
        rank: object = "?"
        role = "actor"
        try:
            hello = wire.recv_msg(conn)
            rank = hello.get("rank", "?")
            if hello.get("evaluates"):
                role = "evaluator"
                self._evaluate(conn, rank, addr)
                return
            self.log(f"learner: actor rank={rank} connected from {addr[0]}:{addr[1]}")
            while not self._done.is_set():
                with self._lock:
                    paused = self._paused
                    msg = {"version": self.version, "weights": self._wire_weights}
                if paused:  # park the actor, idle, until the learner ends
                    self._done.wait()
                    break
                wire.send_msg(conn, msg)
                self._ingest(wire.recv_msg(conn))
        except OSError as exc:
            # Expected once we shut the connections down; otherwise an actor went away
            # and the others carry on without it.
            if not self._done.is_set():
                self.log(f"learner: {role} rank={rank} disconnected: {exc}")
        except (KeyError, TypeError, ValueError, ArithmeticError) as exc:
            self.log(f"learner: dropping {role} rank={rank}: bad message: {exc!r}")
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _evaluate(self, conn: socket.socket, rank: object, addr: Any) -> None:
        """_evaluate serves an evaluator (the job's helper role): the latest weights on each
        request; its answers are logged, never learned from. It is no actor: the scale rule
        does not count it."""
        self.log(f"learner: evaluator rank={rank} connected from {addr[0]}:{addr[1]}")
        with self._lock:
            self._evaluators.add(conn)
        try:
            while not self._done.is_set():
                with self._lock:
                    msg = {"version": self.version, "weights": self._wire_weights}
                wire.send_msg(conn, msg)
                answer = wire.recv_msg(conn)
                self.log(
                    f"learner: evaluator: version={int(answer['version'])} "
                    f"eval_return={float(answer['evaluated']):.1f}"
                )
        finally:
            with self._lock:
                self._evaluators.discard(conn)

    def _ingest(self, batch: dict[str, Any]) -> None:
        """_ingest applies one batch: a gradient step, then the bookkeeping for stopping."""
        episodes = [
            Episode(obs=e["obs"], actions=e["actions"], rewards=e["rewards"])
            for e in batch["episodes"]
        ]
        returns = [float(r) for r in batch["returns"]]
        with self._lock:
            if self._done.is_set() or self._paused or not episodes:
                return
            behavior = self._history.get(int(batch["version"]))
            if behavior is not None:
                self._pg.update(episodes, behavior)
                self.version += 1
                self._wire_weights = to_wire(self._pg.weights)
                self._history[self.version] = dict(self._pg.weights)
                self._history.pop(self.version - HISTORY_VERSIONS, None)
            before, self.episodes = self.episodes, self.episodes + len(returns)
            self._returns.extend(returns)
            avg = self._average()
            if self.episodes // self.config.window > before // self.config.window:
                self.log(f"episodes={self.episodes} avg_return={avg:.1f} version={self.version}")
            if len(self._returns) == self.config.window and avg >= self.config.target:
                seconds = time.monotonic() - self._start
                total = seconds + self._seconds_before
                self.log(
                    f"solved: avg_return={avg:.1f} episodes={self.episodes} "
                    f"seconds={seconds:.1f} (trained_s={total:.1f} in all)"
                )
                self._solved = True
                self._done.set()
            elif self._pause_due():
                self._paused = True
                self.log(
                    f"learner: paused at version={self.version} (--pause-at-version): "
                    "waiting to be evicted or stopped"
                )

    def _pause_due(self) -> bool:
        """_pause_due: --pause-at-version is reached by a learner that started afresh."""
        at = self.config.pause_at_version
        return at > 0 and self.resumed_from is None and self.version >= at

    def _average(self) -> float:
        """_average is the mean return over the window (0 before any episode)."""
        return float(np.mean(self._returns)) if self._returns else 0.0

    def log(self, line: str, out: TextIO | None = None) -> None:
        """log writes one line and flushes, so progress shows up live in job logs."""
        print(line, file=out or self._out, flush=True)


def _keepalive(conn: socket.socket) -> None:
    """_keepalive makes the kernel probe an idle connection and break it when the peer is
    gone (the TCP_KEEP* options exist on Linux and macOS; elsewhere its defaults apply)."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
    ):
        option = getattr(socket, name, None)
        if option is not None:
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.IPPROTO_TCP, option, value)


def run_learner(port: int, config: LearnerConfig) -> int:
    """run_learner listens on 0.0.0.0:port and trains, resuming from a checkpoint if there is
    one; it returns the exit code."""
    learner = Learner(config)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, learner.terminate)
    with socket.create_server(("0.0.0.0", port), backlog=128) as listener:
        print(
            f"learner: listening on 0.0.0.0:{port} (target {config.target:g} over "
            f"{config.window} episodes, max {config.max_seconds:g} s)",
            flush=True,
        )
        learner.resume()
        link = ArrangerLink.connect(config.actor_set, learner.log)
        if link is not None:
            print(
                f"learner: elastic: {link.wanted} of up to {link.most} {config.actor_set} "
                f"wanted; checkpoints in {config.checkpoint_dir}",
                flush=True,
            )
        try:
            return learner.serve(listener, link)
        finally:
            if link is not None:
                link.close()
