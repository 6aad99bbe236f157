"""member: one member of the population: it trains a CartPole policy in rounds and, between
rounds, exploits and explores through its peers (see the package's docstring).

`Trainer` is the learning alone (no I/O but its checkpoints); `run_member` is the rounds,
with the job (arranger.job.Job) as the population's blackboard.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import grpc
import numpy as np

from arranger.examples.cartpole import checkpoint
from arranger.examples.cartpole.actor import play_episode
from arranger.examples.cartpole.checkpoint import CheckpointError, LearnerState
from arranger.examples.cartpole.env import CartPole
from arranger.examples.cartpole.policy import PolicyGradient, init_weights
from arranger.examples.pbt.population import (
    Standing,
    caught_up,
    exploit_target,
    explored,
    standing_of,
)
from arranger.job import Job, NotInExperiment, Peer

PEER_POLL_S = 0.2  # between two reads of the peers while waiting for them


@dataclass(frozen=True)
class MemberConfig:
    """MemberConfig: the member's starting learning rate, its seed (with its index: the
    initial weights and every draw), how long it trains (rounds of updates of episodes),
    the episodes its mean return is taken over, the policy's size, where checkpoints go and
    how long it waits for its peers each round."""

    lr: float
    index: int = 0
    seed: int = 0
    rounds: int = 6
    updates_per_round: int = 5
    episodes_per_update: int = 4
    window: int = 20
    hidden: int = 16
    checkpoints: Path = Path(".")
    peer_wait_s: float = 30.0


class Trainer:
    """Trainer: a policy learning CartPole by policy gradient, alone; `updates` counts its
    steps (its own, whatever it copies), `returns` the last window's episode returns."""

    def __init__(self, config: MemberConfig) -> None:
        self.config = config
        self.rng = np.random.default_rng([config.seed, config.index])
        self.env = CartPole(self.rng)
        self.pg = PolicyGradient(init_weights(self.rng, config.hidden), lr=config.lr)
        self.updates = 0
        self.episodes = 0
        self.returns: deque[float] = deque(maxlen=config.window)

    @property
    def lr(self) -> float:
        return self.pg.lr

    def train(self, updates: int) -> None:
        for _ in range(updates):
            batch = [
                play_episode(self.pg.weights, self.env, self.rng)
                for _ in range(self.config.episodes_per_update)
            ]
            self.returns.extend(sum(ep.rewards) for ep in batch)
            self.episodes += len(batch)
            self.pg.update(batch)
            self.updates += 1

    def mean_return(self) -> float:
        return float(np.mean(self.returns)) if self.returns else 0.0

    def save(self, directory: Path) -> Path:
        """save writes the trainer's checkpoint in `directory` (atomically) and returns its
        path."""
        pg = self.pg
        state = LearnerState(
            weights=dict(pg.weights),
            adam_m=dict(pg.m),
            adam_v=dict(pg.v),
            adam_t=pg.t,
            version=self.updates,
            episodes=self.episodes,
            returns=list(self.returns),
        )
        return checkpoint.save(directory, state)

    def take(self, state: LearnerState, lr: float) -> None:
        """take: a peer's weights, Adam state and recent returns (its mean return is then
        the copy's), with learning rate `lr`; the trainer's own step count goes on."""
        pg = self.pg
        pg.weights, pg.m, pg.v, pg.t = (
            dict(state.weights),
            dict(state.adam_m),
            dict(state.adam_v),
            state.adam_t,
        )
        pg.lr = lr
        self.returns.clear()
        self.returns.extend(state.returns)


def run_member(config: MemberConfig, job: Job, out: TextIO = sys.stdout) -> int:
    """run_member trains for config.rounds rounds, reporting, publishing and exploiting
    between them (see the package); it returns the exit code (0)."""

    def say(text: str) -> None:
        print(f"pbt: member {config.index}: {text}", file=out, flush=True)

    trainer = Trainer(config)
    directory = config.checkpoints / job.id
    alone = False
    say(f"lr={config.lr:g} seed={config.seed}, checkpoints in {directory}")
    for round_ in range(1, config.rounds + 1):
        trainer.train(config.updates_per_round)
        step, mean = trainer.updates, trainer.mean_return()
        path = trainer.save(directory)
        job.report(step, mean_return=mean, lr=trainer.lr)
        job.publish(checkpoint=str(path))
        say(f"round {round_}: step={step} mean_return={mean:.1f} lr={trainer.lr:g}")
        if round_ == config.rounds or alone:
            continue
        try:
            job.flush()  # the peers compare at this round what is stored
            peers = wait_for_peers(job, step, config.peer_wait_s)
        except NotInExperiment:
            say("no sweep member: training alone")
            alone = True
            continue
        except grpc.RpcError as exc:  # the server is away: the reports go later
            say(f"round {round_}: no exploit: the server did not answer ({exc.code().name})")
            continue
        me = Standing(config.index, step, mean, trainer.lr, str(path))
        others = [s for s in map(standing_of, peers) if s is not None]
        target = exploit_target(me, others)
        if target is None:
            continue
        try:
            state = checkpoint.load(Path(target.checkpoint).parent, config.hidden)
        except CheckpointError as exc:
            state, why = None, str(exc)
        else:
            why = f"no checkpoint at {target.checkpoint}"
        if state is None:
            say(f"round {round_}: cannot exploit member {target.index}: {why}")
            continue
        lr = explored(target.lr, np.random.default_rng([config.seed, config.index, round_]))
        trainer.take(state, lr)
        job.report(step, exploited_from=target.index, lr=lr)
        say(
            f"round {round_}: exploit member {target.index} (mean_return "
            f"{target.mean_return:.1f} > {mean:.1f}): weights from {target.checkpoint}, "
            f"explore lr {target.lr:g} -> {lr:g}"
        )
    say(f"done: step={trainer.updates} mean_return={trainer.mean_return():.1f}")
    return 0


def wait_for_peers(job: Job, step: int, wait_s: float) -> list[Peer]:
    """wait_for_peers: the peers once each has reported `step` or ended, or as they are
    after `wait_s` (a peer not placed yet is not waited for longer)."""
    deadline = time.monotonic() + wait_s
    while True:
        peers = job.peers()
        if caught_up(peers, step) or time.monotonic() >= deadline:
            return peers
        time.sleep(PEER_POLL_S)
