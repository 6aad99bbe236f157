"""learner: owns the policy, serves actors over TCP and stops once CartPole is solved.

One thread per actor connection sends the current weights, waits for a batch of
episodes and applies a policy-gradient step. A batch is usually stale by about one
version per other actor, since they update the weights while it is played; the learner
keeps recent versions' weights so the update can correct for that (see
PolicyGradient.gradient). The main thread only waits: for the solved event or for the
--max-seconds deadline, then shuts every connection so actors see EOF and exit.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from arranger.examples.cartpole import wire
from arranger.examples.cartpole.policy import (
    Episode,
    PolicyGradient,
    Weights,
    WireWeights,
    init_weights,
    to_wire,
)

ACCEPT_POLL_S = 0.2
# Batches older than this many versions are too stale to learn from; their returns
# still count towards the average, since they were really played.
HISTORY_VERSIONS = 256
THREAD_JOIN_S = 2.0


@dataclass(frozen=True)
class LearnerConfig:
    """LearnerConfig holds the stopping rule (target, window, max_seconds) and training knobs."""

    target: float = 195.0
    window: int = 20
    max_seconds: float = 110.0
    lr: float = 0.005
    hidden: int = 32
    seed: int = 0


class Learner:
    """Learner holds the policy, its version (number of updates applied) and the returns
    of the last `window` episodes; _lock guards all of them and the connection set."""

    def __init__(self, config: LearnerConfig, out: TextIO = sys.stdout) -> None:
        self.config = config
        self._out = out
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._pg = PolicyGradient(
            init_weights(np.random.default_rng(config.seed), config.hidden), lr=config.lr
        )
        self.version = 0
        self._wire_weights: WireWeights = to_wire(self._pg.weights)
        # PolicyGradient.update replaces arrays rather than mutating them, so a shallow
        # copy per version is a snapshot.
        self._history: dict[int, Weights] = {0: dict(self._pg.weights)}
        self.episodes = 0
        self._returns: deque[float] = deque(maxlen=config.window)
        self._conns: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._start = time.monotonic()

    def serve(self, listener: socket.socket) -> int:
        """serve accepts actors on listener until solved (returns 0) or out of time (1).
        The reported seconds and the --max-seconds budget both count from this call."""
        self._start = time.monotonic()
        acceptor = threading.Thread(target=self._accept_loop, args=(listener,), daemon=True)
        acceptor.start()
        solved = self._done.wait(timeout=self.config.max_seconds)
        self._done.set()
        with self._lock:
            avg, episodes = self._average(), self.episodes
            for conn in self._conns:
                # shutdown (not close) wakes the handler blocked in recv; it closes.
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        acceptor.join(THREAD_JOIN_S)
        for thread in list(self._threads):
            thread.join(THREAD_JOIN_S)
        if not solved:
            print(
                f"learner: not solved within {self.config.max_seconds:g} s "
                f"(avg_return={avg:.1f} episodes={episodes}, target {self.config.target:g})",
                file=sys.stderr,
                flush=True,
            )
            return 1
        return 0

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
            thread = threading.Thread(target=self._handle, args=(conn, addr), daemon=True)
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
        try:
            rank = wire.recv_msg(conn).get("rank", "?")
            self._log(f"learner: actor rank={rank} connected from {addr[0]}:{addr[1]}")
            while not self._done.is_set():
                with self._lock:
                    msg = {"version": self.version, "weights": self._wire_weights}
                wire.send_msg(conn, msg)
                self._ingest(wire.recv_msg(conn))
        except OSError as exc:
            # Expected once we shut the connections down; otherwise an actor went away
            # and the others carry on without it.
            if not self._done.is_set():
                self._log(f"learner: actor rank={rank} disconnected: {exc}")
        except (KeyError, TypeError, ValueError) as exc:
            self._log(f"learner: dropping actor rank={rank}: bad message: {exc!r}")
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _ingest(self, batch: dict[str, Any]) -> None:
        """_ingest applies one batch: a gradient step, then the bookkeeping for stopping."""
        episodes = [
            Episode(obs=e["obs"], actions=e["actions"], rewards=e["rewards"])
            for e in batch["episodes"]
        ]
        returns = [float(r) for r in batch["returns"]]
        with self._lock:
            if self._done.is_set() or not episodes:
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
                self._log(f"episodes={self.episodes} avg_return={avg:.1f} version={self.version}")
            if len(self._returns) == self.config.window and avg >= self.config.target:
                seconds = time.monotonic() - self._start
                self._log(
                    f"solved: avg_return={avg:.1f} episodes={self.episodes} seconds={seconds:.1f}"
                )
                self._done.set()

    def _average(self) -> float:
        """_average is the mean return over the window (0 before any episode)."""
        return float(np.mean(self._returns)) if self._returns else 0.0

    def _log(self, line: str) -> None:
        """_log writes one line and flushes, so progress shows up live in job logs."""
        print(line, file=self._out, flush=True)


def run_learner(port: int, config: LearnerConfig) -> int:
    """run_learner listens on 0.0.0.0:port and trains; it returns the exit code."""
    with socket.create_server(("0.0.0.0", port), backlog=128) as listener:
        print(
            f"learner: listening on 0.0.0.0:{port} (target {config.target:g} over "
            f"{config.window} episodes, max {config.max_seconds:g} s)",
            flush=True,
        )
        return Learner(config).serve(listener)
