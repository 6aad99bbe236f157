"""experiments: what the client commands do with an experiment (a sweep's members, one job
each): `get`, `stop`, `delete` and `explain` of a name that is no job, `submit` of a spec with
a sweep, and `submit --wait` until every member has ended.

A name means a job first: only where the server says there is no such job is it looked up as an
experiment (the two share one namespace among unfinished things); where there is neither, the
job's refusal is what the user reads.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from arranger.client import render
from arranger.client.blocking import Client
from arranger.client.channel import ArrangerError
from arranger.client.errors import EXIT_INTERRUPTED, ON_INTERRUPT
from arranger.client.experiment_table import (
    columns_of,
    counts_line,
    document,
    header_rows,
    members_table,
    rows_of,
    sort_rows,
    write_csv,
)
from arranger.client.inert import inert, inert_markup
from arranger.client.text import as_dict
from arranger.v1 import job_pb2

T = TypeVar("T")
U = TypeVar("U")
FINISHED = ("Succeeded", "Failed")
# How `submit --wait` exits for an experiment: 1 if a member failed, else 3 if one was stopped
# or the experiment deleted, else 0 (every member completed).
WAIT_FAILED, WAIT_STOPPED = 1, 3
WAIT_FIRST_S, WAIT_MOST_S = 0.2, 2.0  # the pause between two looks at a waited experiment


def job_or_experiment(name: str, job: Callable[[str], T], experiment: Callable[[str], U]) -> T | U:
    """job_or_experiment: what `job(name)` answers; where the server says there is no such
    job, what `experiment(name)` answers; where there is no such experiment either (or the
    server knows no experiments), the job's refusal is raised."""
    try:
        return job(name)
    except ArrangerError as refused:
        if refused.code != grpc.StatusCode.NOT_FOUND:
            raise
        try:
            return experiment(name)
        except ArrangerError as exc:
            if exc.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNIMPLEMENTED):
                raise refused from None
            raise


def show_experiment(experiment: job_pb2.Experiment, args: argparse.Namespace, out: Console) -> int:
    """show_experiment prints an experiment as `get` does: a header and a table of its members
    (see experiment_table), sorted by `--sort`; or its document (-o json|yaml), or CSV."""
    now = time.time()
    columns = columns_of(experiment)
    rows = rows_of(experiment, columns, now)
    if args.sort:
        rows = sort_rows(rows, columns, args.sort)
    if args.output == "csv":
        write_csv(columns, rows, sys.stdout)
    elif args.output != "table":
        write_document(document(experiment, columns, rows), args.output, out)
    else:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        for key, value in header_rows(experiment.summary, now):
            grid.add_row(key, Text(inert(value)))
        out.print(grid)
        out.print()
        out.print(members_table(columns, rows))
    return 0


def write_document(plain: Any, output: str, out: Console) -> None:
    """write_document prints JSON-shaped data as JSON or YAML: highlighted on a terminal, as it
    is for a program."""
    if output == "json":
        if out.is_terminal:
            out.print_json(json.dumps(plain))
        else:
            sys.stdout.write(json.dumps(plain, indent=2) + "\n")
    else:
        text = yaml.safe_dump(plain, sort_keys=False)
        if out.is_terminal:
            out.print(text, end="", markup=False, highlight=False)
        else:
            sys.stdout.write(text)
    sys.stdout.flush()


def stop_experiment(client: Client, name: str, out: Console) -> None:
    """stop_experiment stops every unfinished member of the experiment `name` names (by its
    id) and says how many were unfinished just before: a member stopped is Succeeded at once,
    so the summary the stop returns counts none."""
    before = client.get_experiment(name).summary
    left = sum(n for stage, n in before.stages.items() if stage not in FINISHED)
    summary = client.stop_experiment(before.id)
    out.print(
        f"experiment {inert_markup(summary.name)}: stopping {left} member{_s(left)}"
        f" (of {summary.members})"
    )


def delete_experiment(client: Client, name: str, out: Console) -> None:
    """delete_experiment deletes the experiment `name` names (by its id: that one, even if
    its name is reused meanwhile) and every member, and says how many."""
    summary = client.get_experiment(name).summary
    client.delete_experiment(summary.id)
    out.print(
        f"experiment {inert_markup(summary.name)} deleted with its {summary.members} "
        f"member{_s(summary.members)}"
    )


def explain_experiment(
    client: Client, experiment: job_pb2.Experiment, output: str, out: Console
) -> int:
    """explain_experiment prints how many members are in each stage, then explains its first
    pending member by index as `explain` explains a job, or says none is pending. With -o
    json|yaml: {experiment: its summary, member: that member's name or null, explanation:
    ExplainJob's answer or null}."""
    summary = experiment.summary
    pending = [m for m in experiment.members if m.job.progress.stage == "Pending"]
    first = min(pending, key=lambda m: m.index, default=None)
    reply = client.explain(first.job.id) if first is not None else None
    if output != "table":
        plain = {
            "experiment": as_dict(summary),
            "member": first.job.name if first is not None else None,
            "explanation": as_dict(reply) if reply is not None else None,
        }
        write_document(plain, output, out)
        return 0
    out.print(
        f"experiment [bold]{inert_markup(summary.name)}[/]: "
        + inert_markup(counts_line(summary.stages, summary.members))
    )
    if first is None or reply is None:
        out.print("no member is pending")
        return 0
    out.print(f"its first pending member, {inert_markup(first.job.name)} (index {first.index}):")
    render.explanation(reply, out)
    return 0


def submitted(summary: job_pb2.ExperimentSummary) -> str:
    """submitted: the line `submit` prints for an experiment, as markup: `experiment sweep-a
    submitted: 12 members (3 points x 4 seeds), maxParallel 4`."""
    seeds = max(summary.seeds, 1)
    points = summary.members // seeds
    limit = f", maxParallel {summary.max_parallel}" if summary.max_parallel else ""
    return (
        f"experiment [bold]{inert_markup(summary.name)}[/] submitted: {summary.members} "
        f"member{_s(summary.members)} ({points} point{_s(points)} x {seeds} seed{_s(seeds)})"
        + limit
    )


def submit_experiment(
    args: argparse.Namespace,
    client: Client,
    summary: job_pb2.ExperimentSummary,
    out: Console,
    errors: Console,
) -> int:
    """submit_experiment says what `submit` made of a spec with a sweep (its line, or its
    summary with -o json|yaml), and with `--wait` waits until every member has ended: exit 0
    if all completed, 1 if any failed, 3 if any was stopped or the experiment was deleted
    (Ctrl-C: 130, the members run on). It looks at the experiment every WAIT_FIRST_S, then
    less often, up to every WAIT_MOST_S."""
    if args.wait:  # before the line that says it was submitted: Ctrl-C may follow it at once
        ON_INTERRUPT.append(
            f"experiment {summary.name} runs on; `arranger stop {summary.id}` stops its members"
        )
    if args.output == "table":
        out.print(submitted(summary))
    else:
        render.dump(summary, args.output, out)
    if not args.wait:
        return 0
    try:
        ended = wait_experiment(client, summary.id)
    except KeyboardInterrupt:  # (a process that is not the CLI's own: the SDK's caller)
        errors.print(ON_INTERRUPT[-1], markup=False)
        return EXIT_INTERRUPTED
    finally:
        ON_INTERRUPT.clear()
    if ended is None or ended.deleted:
        errors.print(f"experiment {inert_markup(summary.name)} was deleted")
        return WAIT_STOPPED
    outcomes = ", ".join(f"{n} {o}" for o, n in sorted(ended.outcomes.items()) if n)
    out.print(f"experiment {inert_markup(ended.name)} ended: {inert_markup(outcomes or 'none')}")
    return wait_exit(ended)


def wait_exit(summary: job_pb2.ExperimentSummary) -> int:
    """wait_exit: how `submit --wait` exits for an ended experiment (see WAIT_FAILED)."""
    if summary.outcomes.get("Failed", 0) or summary.stages.get("Failed", 0):
        return WAIT_FAILED
    if summary.deleted or summary.outcomes.get("Stopped", 0):
        return WAIT_STOPPED
    return 0


def has_ended(summary: job_pb2.ExperimentSummary) -> bool:
    """has_ended: whether every member has finished (or the experiment was deleted)."""
    done = sum(n for stage, n in summary.stages.items() if stage in FINISHED)
    return summary.deleted or done >= summary.members


def wait_experiment(client: Client, ident: str) -> job_pb2.ExperimentSummary | None:
    """wait_experiment: the experiment's summary once every member has ended (see has_ended);
    None if it was deleted and the server no longer knows it."""
    pause_s = WAIT_FIRST_S
    while True:
        try:
            summary = client.get_experiment(ident).summary
        except ArrangerError as exc:
            if exc.code != grpc.StatusCode.NOT_FOUND:
                raise
            return None
        if has_ended(summary):
            return summary
        time.sleep(pause_s)
        pause_s = min(pause_s * 1.5, WAIT_MOST_S)


def _s(count: int) -> str:
    return "" if count == 1 else "s"
