"""actor: plays CartPole with the learner's latest weights and sends back the episodes.

An actor connects to the learner (retrying while the learner is still starting), says
hello, then repeats: receive weights, play a batch of episodes, send them. The learner
closing the connection is the normal end of the job, so the actor then exits 0.
"""

from __future__ import annotations

import socket
import sys
import time
from typing import Any

import numpy as np

from arranger.examples.cartpole import wire
from arranger.examples.cartpole.env import CartPole
from arranger.examples.cartpole.policy import Episode, Weights, from_wire, sample_action

FIRST_BACKOFF_S = 0.05
MAX_BACKOFF_S = 0.5


class ConnectTimeout(Exception):
    """ConnectTimeout means the learner did not accept a connection before the deadline."""


def parse_addr(addr: str) -> tuple[str, int]:
    """parse_addr splits "host:port" (or "[v6]:port") into a host and an int port."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"leader address {addr!r} is not host:port")
    return host.strip("[]"), int(port)


def connect(host: str, port: int, timeout_s: float, refused_ends: bool = False) -> socket.socket:
    """connect returns a connected socket, retrying with a growing back-off until
    timeout_s has passed; then it raises ConnectTimeout carrying the last error. With
    `refused_ends`, a refused connection is raised at once (ConnectionRefusedError): for a peer
    that connects once the learner listens, refused means it has ended."""
    deadline = time.monotonic() + timeout_s
    backoff = FIRST_BACKOFF_S
    while True:
        remaining = deadline - time.monotonic()
        try:
            sock = socket.create_connection((host, port), timeout=max(remaining, 0.1))
        except OSError as exc:
            if refused_ends and isinstance(exc, ConnectionRefusedError):
                raise
            # Refused (learner not bound yet) and name errors (DNS not ready) are both
            # expected while the job starts, so every OSError is retried.
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ConnectTimeout(str(exc)) from exc
            time.sleep(min(backoff, remaining))
            backoff = min(backoff * 2, MAX_BACKOFF_S)
            continue
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock


def play_episode(weights: Weights, env: CartPole, rng: np.random.Generator) -> Episode:
    """play_episode runs one episode to termination or truncation with sampled actions."""
    obs = env.reset()
    episode = Episode(obs=[], actions=[], rewards=[])
    while True:
        action = sample_action(weights, obs, rng)
        episode.obs.append(list(obs))
        episode.actions.append(action)
        obs, reward, terminated, truncated = env.step(action)
        episode.rewards.append(reward)
        if terminated or truncated:
            return episode


def batch_message(version: int, episodes: list[Episode]) -> dict[str, Any]:
    """batch_message builds the reply to weights of the given version."""
    return {
        "version": version,
        "episodes": [
            {"obs": ep.obs, "actions": ep.actions, "rewards": ep.rewards} for ep in episodes
        ],
        "returns": [sum(ep.rewards) for ep in episodes],
    }


def run_actor(
    leader_addr: str, rank: int, episodes_per_batch: int, connect_timeout_s: float, seed: int = 0
) -> int:
    """run_actor serves the learner until it closes the connection; it returns the
    process exit code: 0 on a normal end, 1 if the learner never became reachable."""
    host, port = parse_addr(leader_addr)
    try:
        sock = connect(host, port, connect_timeout_s)
    except ConnectTimeout as exc:
        print(
            f"actor rank={rank}: could not connect to learner at {leader_addr} "
            f"within {connect_timeout_s:g} s (last error: {exc})",
            file=sys.stderr,
            flush=True,
        )
        return 1
    # Seeding with (seed, rank) gives every actor its own, reproducible stream.
    rng = np.random.default_rng([seed, rank])
    env = CartPole(rng)
    batches = 0
    with sock:
        try:
            wire.send_msg(sock, {"rank": rank})
            while True:
                msg = wire.recv_msg(sock)
                weights = from_wire(msg["weights"])
                episodes = [play_episode(weights, env, rng) for _ in range(episodes_per_batch)]
                wire.send_msg(sock, batch_message(int(msg["version"]), episodes))
                batches += 1
        except ConnectionError:
            # EOF, reset and broken pipe all mean the learner has finished (or died);
            # either way there is nobody left to act for.
            print(
                f"actor rank={rank}: learner closed the connection after {batches} "
                "batches; exiting",
                flush=True,
            )
            return 0
