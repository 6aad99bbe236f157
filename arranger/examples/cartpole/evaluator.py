"""evaluator: the job's helper role (an auxiliary worker set): plays CartPole greedily with the
learner's latest weights and reports the return, without training on it.

It connects as an actor does but says it evaluates (hello `{"rank": r, "evaluates": true}`);
then repeats: receive weights, play `episodes` episodes taking the likelier action, print and
report (`job.report(version, eval_return=...)` through the in-job SDK, when run by Arranger)
the mean return, answer `{"version": v, "evaluated": mean}` (which the learner logs and does
not learn from), and wait `every_s`. The learner closing the connection ends it (exit 0): in
the job it is `auxiliary` with `terminationDelaySeconds`, so a pass under way when the
learner ends is finished and reported before it is stopped.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from arranger.examples.cartpole import wire
from arranger.examples.cartpole.actor import ConnectTimeout, connect, parse_addr
from arranger.examples.cartpole.env import CartPole
from arranger.examples.cartpole.policy import Weights, action_probs, from_wire
from arranger.job import Job, NotInJob, current


def greedy_return(weights: Weights, env: CartPole) -> float:
    """greedy_return plays one episode taking the likelier action at every step."""
    obs, total = env.reset(), 0.0
    while True:
        _, probs = action_probs(weights, np.asarray([obs], dtype=np.float64))
        obs, reward, terminated, truncated = env.step(int(probs[0, 1] > 0.5))
        total += reward
        if terminated or truncated:
            return total


def run_evaluator(
    leader_addr: str, rank: int, episodes: int, every_s: float, connect_timeout_s: float
) -> int:
    """run_evaluator evaluates until the learner closes the connection (0), or exits 1 if the
    learner never became reachable."""
    host, port = parse_addr(leader_addr)
    try:
        sock = connect(host, port, connect_timeout_s, refused_ends=True)
    except ConnectionRefusedError:
        # It starts once the learner is ready (startAfter: leaderReady), so the learner
        # listened: refused now, it has ended. Nothing is left to evaluate.
        print(f"evaluator: the learner at {leader_addr} has ended", flush=True)
        return 0
    except ConnectTimeout as exc:
        print(f"evaluator: could not connect to learner at {leader_addr}: {exc}", file=sys.stderr)
        return 1
    try:
        job: Job | None = current()
    except NotInJob:
        job = None
    env = CartPole(np.random.default_rng([7, rank]))
    passes = 0
    try:
        with sock:
            wire.send_msg(sock, {"rank": rank, "evaluates": True})
            while True:
                msg = wire.recv_msg(sock)
                version, weights = int(msg["version"]), from_wire(msg["weights"])
                mean = float(np.mean([greedy_return(weights, env) for _ in range(episodes)]))
                passes += 1
                print(f"evaluator: version={version} eval_return={mean:.1f}", flush=True)
                if job is not None:
                    job.report(version, eval_return=mean)
                wire.send_msg(sock, {"version": version, "evaluated": mean})
                time.sleep(every_s)
    except ConnectionError:
        print(f"evaluator: learner closed the connection after {passes} passes", flush=True)
        return 0
    finally:
        if job is not None:
            job.close()  # sends what is left to report
