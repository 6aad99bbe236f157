"""Command line: `python -m arranger.examples.pbt [--lr LR] [options]`, run by Arranger as a
sweep member (job.yaml): its index, seed and learning rate come from the sweep
(ARRANGER_SWEEP_INDEX, ARRANGER_SWEEP_SEED, ARRANGER_SWEEP_LR) unless given."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from arranger.examples.pbt.member import MemberConfig, run_member
from arranger.job import NotInJob, current


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="python -m arranger.examples.pbt",
        description="Population-based training of CartPole policies, one sweep member each.",
    )
    parser.add_argument(
        "--lr", type=float, default=float(env("ARRANGER_SWEEP_LR", "0.01")), help="starting lr"
    )
    parser.add_argument("--index", type=int, default=int(env("ARRANGER_SWEEP_INDEX", "0")))
    parser.add_argument("--seed", type=int, default=int(env("ARRANGER_SWEEP_SEED", "0")))
    parser.add_argument("--rounds", type=int, default=6, help="rounds of training (default 6)")
    parser.add_argument(
        "--updates-per-round", type=int, default=5, help="updates between two exploits"
    )
    parser.add_argument("--episodes-per-update", type=int, default=4)
    parser.add_argument(
        "--checkpoints",
        default="$ARRANGER_VOLUME_CKPT/arranger-pbt",
        help="shared directory of every member's checkpoints; $VARIABLES are expanded "
        "(default $ARRANGER_VOLUME_CKPT/arranger-pbt)",
    )
    parser.add_argument(
        "--peer-wait-s", type=float, default=30.0, help="the longest wait for peers a round"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.rounds < 1 or args.updates_per_round < 1 or args.episodes_per_update < 1:
        sys.exit("error: --rounds, --updates-per-round and --episodes-per-update must be >= 1")
    # No shell runs a pod's command, so the member expands $VARIABLES itself.
    checkpoints = os.path.expandvars(args.checkpoints)
    if "$" in checkpoints:
        sys.exit(f"error: --checkpoints {args.checkpoints!r}: a variable in it is not set")
    config = MemberConfig(
        lr=args.lr,
        index=args.index,
        seed=args.seed,
        rounds=args.rounds,
        updates_per_round=args.updates_per_round,
        episodes_per_update=args.episodes_per_update,
        checkpoints=Path(checkpoints),
        peer_wait_s=args.peer_wait_s,
    )
    try:
        job = current()
    except NotInJob as exc:
        sys.exit(f"error: {exc}")
    with job:
        return run_member(config, job)


if __name__ == "__main__":
    sys.exit(main())
