"""history is `arranger history`: the accounting records of finished jobs, as a table, JSON or CSV.

Times on the command line are ISO dates or datetimes (`2024-05-01`, `2024-05-01T12:00`, local
time unless they say otherwise) or an age before now: a number and a unit, `90s`, `30m`, `12h`,
`7d`, `2w`.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TextIO

import grpc
from rich.console import Console
from rich.table import Table

from arranger.client import render
from arranger.client.channel import ArrangerError
from arranger.client.inert import csv_text, inert_markup
from arranger.client.text import age, as_dict
from arranger.exits import signal_of
from arranger.v1 import arranger_pb2

if TYPE_CHECKING:
    from arranger.client.blocking import Client

RELATIVE = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
USAGE_COLUMNS = (  # from the agents' samples; empty where none came
    "avg_cpu_cores",
    "peak_cpu_cores",
    "peak_memory_bytes",
    "avg_gpu_utilization",
    "peak_gpu_memory_bytes",
)
CSV_COLUMNS = (
    "id",
    "name",
    "owner",
    "queue",
    "priority",
    "submit_time",
    "start_time",
    "end_time",
    "waited_seconds",
    "ran_seconds",
    "stage",
    "outcome",
    "reason",
    "stopped_by",
    "leader_exit_code",
    "worker_exit_codes",
    "pod_exit_codes",
    "nodes",
    "pods",
    "restarts",
    "cpu_core_hours",
    "gpu_hours",
    "memory_gib_hours",
    *USAGE_COLUMNS,
    "message",
)


def parse_when(text: str, now: float) -> float:
    """parse_when: unix seconds of an ISO date or datetime, or of `now` less an age (`7d`).
    Anything else is a ValueError naming the forms it takes."""
    text = text.strip()
    match = RELATIVE.fullmatch(text)
    if match:
        return now - float(match.group(1)) * UNIT_S[match.group(2)]
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time: give an ISO date (2024-05-01, 2024-05-01T12:00) or an "
            "age like 90s, 30m, 12h, 7d, 2w"
        ) from None


def add_history_arguments(p: argparse.ArgumentParser, handler: Callable[..., int]) -> None:
    p.add_argument("--user", default="", help="only this user's jobs")
    p.add_argument("--since", default=None, metavar="T", help="jobs that ended at T or later")
    p.add_argument("--until", default=None, metavar="T", help="jobs that ended before T")
    p.add_argument("--queue", default="", help="only this queue's jobs")
    p.add_argument("--name", default="", help="only jobs of this name (every run of it)")
    p.add_argument(
        "--experiment", default="", metavar="NAME", help="only this experiment's members"
    )
    p.add_argument("-o", "--output", choices=("table", "json", "csv"), default="table")
    p.set_defaults(handler=handler)


def show_history(args: argparse.Namespace, client: Client, console: Console) -> int:
    """show_history prints the records `args` select, oldest end first."""
    now = time.time()
    since = parse_when(args.since, now) if args.since else None
    until = parse_when(args.until, now) if args.until else None
    experiment = args.experiment and experiment_id(client, args.experiment)
    records = client.history(args.user, since, until, args.queue, args.name, experiment=experiment)
    if args.output == "json":
        plain = [outcome_beside_stage(as_dict(r)) for r in records]
        if console.is_terminal:
            console.print_json(json.dumps(plain))
        else:
            sys.stdout.write(json.dumps(plain, indent=2) + "\n")
    elif args.output == "csv":
        write_csv(records, sys.stdout)
    elif not records:
        console.print("no finished jobs")
    else:
        console.print(history_table(records))
    return 0


def experiment_id(client: Client, name: str) -> str:
    """experiment_id: the id of the experiment `name` names (records name it by id: a name is
    reused once its experiment ended); one the server no longer knows (deleted) is taken to
    be an id as it is."""
    try:
        return client.get_experiment(name).summary.id
    except ArrangerError as exc:
        if exc.code != grpc.StatusCode.NOT_FOUND:
            raise
        return name


def outcome_beside_stage(plain: dict[str, Any]) -> dict[str, Any]:
    """outcome_beside_stage: a record's JSON with the key `outcome` right after `stage`."""
    outcome = plain.pop("outcome", "")
    shown: dict[str, Any] = {}
    for key, value in plain.items():
        shown[key] = value
        if key == "stage":
            shown["outcome"] = outcome
    return shown


def code_text(code: int | None, signal: str = "") -> str:
    """code_text: an exit code as EXIT shows it: "1", "143(SIGTERM)", "none" (no code)."""
    if code is None:
        return "none"
    return f"{code}({signal})" if signal else str(code)


def exit_codes(record: arranger_pb2.HistoryRecord) -> str:
    """exit_codes: the workers' exit codes, how many workers ended with each: "15x0 1x143(SIGTERM)
    2xnone" (none: no code, as for a worker that never ran or was lost)."""
    return " ".join(
        f"{c.pods}x{code_text(code, signal_of(code))}"
        for c in record.worker_exit_codes
        for code in [c.exit_code if c.HasField("exit_code") else None]
    )


def exits_text(record: arranger_pb2.HistoryRecord) -> str:
    """exits_text: EXIT's cell: the leader's code, then the workers' counts after "; "."""
    leader = record.leader_exit_code if record.HasField("leader_exit_code") else None
    workers = exit_codes(record)
    return code_text(leader, signal_of(leader)) + (f"; {workers}" if workers else "")


def pod_exit_codes(record: arranger_pb2.HistoryRecord) -> str:
    """pod_exit_codes: each pod's code, "learner=0 actors-0=143(SIGTERM)" ("" for a record of
    an older server, which kept none)."""
    return " ".join(
        f"{e.pod}={code_text(e.exit_code if e.HasField('exit_code') else None, e.signal)}"
        for e in record.pod_exits
    )


def _leader_exit(record: arranger_pb2.HistoryRecord) -> str:
    return str(record.leader_exit_code) if record.HasField("leader_exit_code") else ""


def _iso(record: arranger_pb2.HistoryRecord, field: TimeField) -> str:
    if not record.HasField(field):
        return ""
    stamp = getattr(record, field)
    return datetime.fromtimestamp(stamp.ToNanoseconds() / 1e9).isoformat(timespec="seconds")


TimeField = Literal["submit_time", "start_time", "end_time"]


def history_table(records: Sequence[arranger_pb2.HistoryRecord]) -> Table:
    table = Table(box=None, header_style="bold")
    columns = (
        "ENDED",
        "NAME",
        "ID",
        "OWNER",
        "QUEUE",
        "STAGE",
        "OUTCOME",
        "REASON",
        "WAITED",
        "RAN",
        "EXIT",
        "CPU-H",
        "GPU-H",
        "MEM-GIB-H",
        "NODES",
    )
    for column in columns:
        table.add_column(column, no_wrap=column != "NODES")
    for r in records:
        reason = f"{r.reason} by {r.stopped_by}" if r.stopped_by else r.reason
        table.add_row(
            _iso(r, "end_time").replace("T", " "),
            inert_markup(r.name),
            inert_markup(r.id),
            inert_markup(r.owner or "-"),
            inert_markup(r.queue),
            render.stage(r.stage),
            inert_markup(r.outcome or "-"),
            inert_markup(reason),
            age(r.waited_seconds),
            age(r.ran_seconds),
            exits_text(r),
            f"{r.cpu_core_hours:.2f}",
            f"{r.gpu_hours:.2f}",
            f"{r.memory_gib_hours:.2f}",
            inert_markup(",".join(r.nodes) or "-"),
        )
    return table


def write_csv(records: Sequence[arranger_pb2.HistoryRecord], out: TextIO) -> None:
    """write_csv: one header line, then a line per record (times ISO, local time). Each
    text is inert (`\\x1b`, `\\n` written out): a CSV is read on a terminal too, with `cat`;
    and never read as a formula by a spreadsheet (see inert.csv_text)."""
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for r in records:
        writer.writerow(
            csv_text(cell) if isinstance(cell, str) else cell
            for cell in (
                r.id,
                r.name,
                r.owner,
                r.queue,
                r.priority,
                _iso(r, "submit_time"),
                _iso(r, "start_time"),
                _iso(r, "end_time"),
                f"{r.waited_seconds:.3f}",
                f"{r.ran_seconds:.3f}",
                r.stage,
                r.outcome,
                r.reason,
                r.stopped_by,
                _leader_exit(r),
                exit_codes(r),
                pod_exit_codes(r),
                " ".join(r.nodes),
                r.pods,
                r.restarts,
                f"{r.cpu_core_hours:.6f}",
                f"{r.gpu_hours:.6f}",
                f"{r.memory_gib_hours:.6f}",
                *_usage(r),
                r.message,
            )
        )
    out.flush()


def _usage(r: arranger_pb2.HistoryRecord) -> tuple[object, ...]:
    """_usage: the record's usage figures in USAGE_COLUMNS' order, "" where unset."""
    return (
        r.avg_cpu_cores if r.HasField("avg_cpu_cores") else "",
        r.peak_cpu_cores if r.HasField("peak_cpu_cores") else "",
        r.peak_memory_bytes if r.HasField("peak_memory_bytes") else "",
        r.avg_gpu_utilization if r.HasField("avg_gpu_utilization") else "",
        r.peak_gpu_memory_bytes if r.HasField("peak_gpu_memory_bytes") else "",
    )
