"""joblist is `arranger list`, kept apart from rich: a listing into a pipe or a script costs
gRPC's imports and no more; a terminal gets the coloured stage through rich."""

from __future__ import annotations

import argparse
import sys

from arranger.client.blocking import Client
from arranger.client.text import jobs_lines, write_plain
from arranger.states import Stage
from arranger.v1 import job_pb2

UNFINISHED = tuple(s.value for s in Stage if not s.finished)


def listed_stages(args: argparse.Namespace) -> list[str]:
    """listed_stages: the stages `list` asks for: those `--stage` names; with none, every stage
    under `--all`, else the unfinished ones."""
    if args.stage:
        return list(args.stage)
    return [] if getattr(args, "all", False) else list(UNFINISHED)


def listed_experiments(
    experiments: list[job_pb2.ExperimentSummary], stages: list[str]
) -> list[job_pb2.ExperimentSummary]:
    """listed_experiments: those of `experiments` a listing of `stages` shows (none: every
    stage): each not deleted with a member in one of them."""
    return [
        e
        for e in experiments
        if not e.deleted and (not stages or any(e.stages.get(s, 0) for s in stages))
    ]


def cmd_list(args: argparse.Namespace) -> int:
    """cmd_list prints the jobs the filters select (unfinished ones unless `--all` or
    `--stage`): a table, or JSON/YAML (-o). In the table each experiment with a member in
    those stages is one line (`--expand`: its members are listed as jobs instead); JSON and
    YAML list jobs, members too. `--experiment` lists that experiment's members, in every
    stage unless `--stage`."""
    stages = listed_stages(args)
    experiments: list[job_pb2.ExperimentSummary] = []
    with Client(args.server, token=args.token, ca=args.ca) as client:
        if args.experiment:
            jobs = client.jobs(
                args.queue, args.stage, args.user, args.mine, experiment=args.experiment
            )
        elif args.expand or args.output != "table":
            jobs = client.jobs(args.queue, stages, owner=args.user, mine=args.mine)
        else:
            jobs, found = client.jobs_and_experiments(args.queue, stages, args.user, args.mine)
            experiments = listed_experiments(found, stages)
    if sys.stdout.isatty() and (jobs or experiments or args.output != "table"):
        from arranger.client import render  # noqa: PLC0415
        from arranger.client.commands import console  # noqa: PLC0415

        if args.output != "table":
            render.dump(jobs, args.output, console)
        else:
            render.print_jobs(jobs, console, experiments)
    elif args.output != "table":
        write_plain(jobs, args.output, sys.stdout)
    elif not jobs and not experiments:
        hidden = not args.stage and not getattr(args, "all", False) and not args.experiment
        print("no unfinished jobs (--all lists finished ones)" if hidden else "no jobs", flush=True)
    else:
        lines = jobs_lines(jobs, experiments=experiments)
        sys.stdout.write("".join(line + "\n" for line in lines))
        sys.stdout.flush()
    return 0
