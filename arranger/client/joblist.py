"""joblist is `arranger list`, kept apart from rich: a listing into a pipe or a script costs
gRPC's imports and no more; a terminal gets the coloured stage through rich."""

from __future__ import annotations

import argparse
import sys

from arranger.client.blocking import Client
from arranger.client.text import jobs_lines, write_plain
from arranger.states import Stage

UNFINISHED = tuple(s.value for s in Stage if not s.finished)


def listed_stages(args: argparse.Namespace) -> list[str]:
    """listed_stages: the stages `list` asks for: those `--stage` names; with none, every stage
    under `--all`, else the unfinished ones."""
    if args.stage:
        return list(args.stage)
    return [] if getattr(args, "all", False) else list(UNFINISHED)


def cmd_list(args: argparse.Namespace) -> int:
    """cmd_list prints the jobs the filters select (unfinished ones unless `--all` or
    `--stage`): a table, or JSON/YAML (-o)."""
    with Client(args.server, token=args.token, ca=args.ca) as client:
        jobs = client.jobs(args.queue, listed_stages(args), owner=args.user, mine=args.mine)
    if sys.stdout.isatty() and (jobs or args.output != "table"):
        from arranger.client import render  # noqa: PLC0415
        from arranger.client.commands import console  # noqa: PLC0415

        if args.output != "table":
            render.dump(jobs, args.output, console)
        else:
            render.print_jobs(jobs, console)
    elif args.output != "table":
        write_plain(jobs, args.output, sys.stdout)
    elif not jobs:
        hidden = not args.stage and not getattr(args, "all", False)
        print("no unfinished jobs (--all lists finished ones)" if hidden else "no jobs", flush=True)
    else:
        sys.stdout.write("".join(line + "\n" for line in jobs_lines(jobs)))
        sys.stdout.flush()
    return 0
