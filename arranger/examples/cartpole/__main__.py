"""Command line: `python -m arranger.examples.cartpole learner|actor|evaluator [options]`.

Where to listen or connect comes from the environment Arranger sets for the job:
ARRANGER_PORT_RPC for the learner; ARRANGER_LEADER_ADDR and ARRANGER_WORKER_RANK for
actors. The learner's checkpoints go to ARRANGER_SCRATCH_DIR unless --checkpoint-dir says
otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from arranger.examples.cartpole.actor import run_actor
from arranger.examples.cartpole.evaluator import run_evaluator
from arranger.examples.cartpole.learner import LearnerConfig, run_learner


def build_parser() -> argparse.ArgumentParser:
    """build_parser describes both subcommands and their options."""
    parser = argparse.ArgumentParser(
        prog="python -m arranger.examples.cartpole",
        description="Distributed policy-gradient CartPole: one learner, N actors over TCP.",
    )
    sub = parser.add_subparsers(dest="role", required=True)

    learner = sub.add_parser("learner", help="train the policy; listens on $ARRANGER_PORT_RPC")
    learner.add_argument(
        "--target",
        type=float,
        default=195.0,
        help="stop once the average return reaches this (default 195)",
    )
    learner.add_argument(
        "--window", type=int, default=20, help="episodes averaged for --target (default 20)"
    )
    learner.add_argument(
        "--max-seconds",
        type=float,
        default=110.0,
        help="give up and exit 1 after this long (default 110)",
    )
    learner.add_argument("--lr", type=float, default=0.005, help="Adam step size")
    learner.add_argument("--hidden", type=int, default=32, help="hidden units of the policy")
    learner.add_argument("--seed", type=int, default=0, help="seed of the initial weights")
    learner.add_argument(
        "--checkpoint-dir",
        default=os.environ.get("ARRANGER_SCRATCH_DIR", ""),
        help="where to checkpoint and resume from; $VARIABLES are expanded "
        "(default $ARRANGER_SCRATCH_DIR; '': nowhere)",
    )
    learner.add_argument(
        "--actor-set", default="actors", help="the worker set to scale (default actors)"
    )
    learner.add_argument(
        "--scale-every",
        type=int,
        default=20,
        help="updates between looks of the scale rule (default 20)",
    )
    learner.add_argument(
        "--scale-min-gain",
        type=float,
        default=10.0,
        help="ask for one more actor when the average return rose less than this (default 10)",
    )
    learner.add_argument(
        "--pause-at-version",
        type=int,
        default=0,
        help="stop learning after this many updates until evicted or stopped, unless "
        "resumed from a checkpoint (to try eviction and resume; default 0: never)",
    )

    actor = sub.add_parser("actor", help="play episodes for the learner at $ARRANGER_LEADER_ADDR")
    actor.add_argument(
        "--episodes-per-batch",
        type=int,
        default=2,
        help="episodes played per weights update (default 2)",
    )
    actor.add_argument(
        "--connect-timeout",
        type=float,
        default=60.0,
        help="seconds to keep retrying the learner (default 60)",
    )
    actor.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed combined with $ARRANGER_WORKER_RANK for the actor's RNG",
    )
    evaluator = sub.add_parser(
        "evaluator", help="evaluate the learner's policy greedily and report its return"
    )
    evaluator.add_argument("--episodes", type=int, default=3, help="episodes a pass (default 3)")
    evaluator.add_argument(
        "--every", type=float, default=1.0, help="seconds between passes (default 1)"
    )
    evaluator.add_argument(
        "--connect-timeout", type=float, default=60.0, help="seconds to keep retrying the learner"
    )
    return parser


def _env_int(name: str, default: int | None = None) -> int:
    """_env_int reads an integer environment variable, exiting 2 if it is unusable."""
    raw = os.environ.get(name)
    if raw is None and default is not None:
        return default
    try:
        return int(raw or "")
    except ValueError:
        sys.exit(f"error: ${name} must be set to an integer (got {raw!r})")


def main(argv: Sequence[str] | None = None) -> int:
    """main parses argv and runs the chosen role; it returns the process exit code."""
    args = build_parser().parse_args(argv)
    if args.role == "learner":
        if args.window < 1:
            sys.exit("error: --window must be at least 1")
        if args.scale_every < 1:
            sys.exit("error: --scale-every must be at least 1")
        # No shell runs a pod's command, so the learner expands $VARIABLES itself.
        checkpoints = os.path.expandvars(args.checkpoint_dir)
        config = LearnerConfig(
            target=args.target,
            window=args.window,
            max_seconds=args.max_seconds,
            lr=args.lr,
            hidden=args.hidden,
            seed=args.seed,
            checkpoint_dir=Path(checkpoints) if checkpoints else None,
            actor_set=args.actor_set,
            scale_every=args.scale_every,
            scale_min_gain=args.scale_min_gain,
            pause_at_version=args.pause_at_version,
        )
        return run_learner(_env_int("ARRANGER_PORT_RPC"), config)
    leader = os.environ.get("ARRANGER_LEADER_ADDR")
    if not leader:
        sys.exit("error: $ARRANGER_LEADER_ADDR must be set to the learner's host:port")
    rank = _env_int("ARRANGER_WORKER_RANK", 0)
    if args.role == "evaluator":
        if args.episodes < 1 or not args.every >= 0:
            sys.exit("error: --episodes must be at least 1 and --every at least 0")
        try:
            return run_evaluator(leader, rank, args.episodes, args.every, args.connect_timeout)
        except ValueError as exc:
            sys.exit(f"error: {exc}")
    if args.episodes_per_batch < 1:
        sys.exit("error: --episodes-per-batch must be at least 1")
    try:
        return run_actor(
            leader,
            rank,
            args.episodes_per_batch,
            args.connect_timeout,
            args.seed,
        )
    except ValueError as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    sys.exit(main())
