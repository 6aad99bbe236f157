"""experiment_table: an experiment's members as rows of named columns, as `arranger get
EXPERIMENT` shows them: a table, CSV, or a JSON/YAML document; sorted by any column.

The columns are, in order: `index`, `name`, each sweep parameter (in the sweep's order), `seed`,
`stage`, `outcome`, `elapsed` (seconds from the member's start to its finish, or to now while it
runs), `exit_code` (its leader's last), `step` (of its latest report), then each key any member
reported (their union, by name). A parameter or key whose name a column before it has is named
`values.NAME` or `latest.KEY` instead, so every column has a name of its own. A cell a member
has no value for is None: `-` in the table, empty in CSV, null in JSON.

Nothing here makes a call or reads the clock: `now` comes with the rows.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from rich.table import Table
from rich.text import Text

from arranger.client.inert import csv_text, inert, inert_markup
from arranger.client.text import STAGE_STYLE, duration, seconds_of, stage_counts
from arranger.v1 import job_pb2

Cell = str | int | float | None
Row = dict[str, Cell]
FIXED_BEFORE = ("index", "name")
FIXED_AFTER = ("seed", "stage", "outcome", "elapsed", "exit_code", "step")
RESERVED = frozenset((*FIXED_BEFORE, *FIXED_AFTER, "notes"))  # `notes`: a JSON row's own
STAGE_ORDER = ("Pending", "Starting", "Running", "Rescheduling", "Succeeded", "Failed")
NOT_PARAMETERS = ("seed", "index")  # in every member's values, never a parameter


@dataclass(frozen=True)
class Column:
    """Column: one column of the members' table. `name` is how --sort, CSV and JSON name it;
    `kind` says where its cells come from: `fixed` (the member itself), `value` (the sweep
    value of parameter `source`) or `latest` (the latest reported value of key `source`)."""

    name: str
    kind: str
    source: str = ""


def columns_of(experiment: job_pb2.Experiment) -> list[Column]:
    """columns_of: the experiment's columns, in the module's order."""
    parameters = list(experiment.summary.parameters)
    for member in experiment.members:  # a server that names none in the summary
        parameters += [p for p in member.values if p not in NOT_PARAMETERS and p not in parameters]
    keys = sorted({key for member in experiment.members for key in member.latest})
    taken = set(RESERVED)
    found = [Column(name, "fixed") for name in FIXED_BEFORE]
    for parameter in parameters:
        name = parameter if parameter not in taken else f"values.{parameter}"
        taken.add(name)
        found.append(Column(name, "value", parameter))
    found += [Column(name, "fixed") for name in FIXED_AFTER]
    for key in keys:
        name = key if key not in taken else f"latest.{key}"
        taken.add(name)
        found.append(Column(name, "latest", key))
    return found


def rows_of(experiment: job_pb2.Experiment, columns: Sequence[Column], now: float) -> list[Row]:
    """rows_of: a row per member, by index, each cell under its column's name: numbers as
    numbers (a seed too), sweep values as the text the member was given."""
    return [_row(member, columns, now) for member in sorted(experiment.members, key=_index)]


def _index(member: job_pb2.ExperimentMember) -> int:
    return member.index


def _row(member: job_pb2.ExperimentMember, columns: Sequence[Column], now: float) -> Row:
    progress = member.job.progress
    started = seconds_of(progress.start_time)
    finished = seconds_of(progress.finish_time)
    seed = member.values.get("seed")
    fixed: dict[str, Cell] = {
        "index": member.index,
        "name": member.job.name,
        "seed": int(seed) if seed is not None and seed.isdigit() else seed,
        "stage": progress.stage or None,
        "outcome": progress.outcome or None,
        "elapsed": None if started is None else max(0.0, (finished or now) - started),
        "exit_code": member.exit_code if member.HasField("exit_code") else None,
        "step": member.step if member.step or member.latest else None,
    }
    row: Row = {}
    for column in columns:
        if column.kind == "fixed":
            row[column.name] = fixed[column.name]
        elif column.kind == "value":
            row[column.name] = member.values.get(column.source)
        else:
            row[column.name] = member.latest.get(column.source)
    return row


def column_named(columns: Sequence[Column], text: str) -> Column:
    """column_named: the column `text` names (its name, in any case); a ValueError naming every
    column otherwise."""
    for column in columns:
        if column.name == text:
            return column
    for column in columns:
        if column.name.lower() == text.lower():
            return column
    names = ", ".join(c.name for c in columns)
    raise ValueError(f"--sort {text!r}: no such column; the columns are {names}")


def sort_rows(rows: Sequence[Row], columns: Sequence[Column], key: str) -> list[Row]:
    """sort_rows: the rows ordered by the column `key` names, ascending (`-KEY`: descending),
    rows without a value last either way; equal values keep their rows' order. A column whose
    values are all numbers (or text that reads as one: `1e-4`) is ordered by number, `stage` by
    a job's life (Pending first), any other by text."""
    descending = key.startswith("-")
    name = column_named(columns, key[1:] if descending else key).name
    present = [row for row in rows if row.get(name) is not None]
    missing = [row for row in rows if row.get(name) is None]
    order = _order([row[name] for row in present], name)
    ranked = sorted(present, key=lambda row: order(row[name]), reverse=descending)
    return ranked + missing


def _order(values: Sequence[Cell], name: str) -> Any:
    """_order: the sort key for a column's present values (see sort_rows)."""
    if name == "stage":
        known = {stage: n for n, stage in enumerate(STAGE_ORDER)}
        return lambda value: (known.get(str(value), len(known)), str(value))
    if all(_number(value) is not None for value in values):
        return _number
    return str


def _number(value: Cell) -> float | None:
    """_number: the number a cell holds or reads as (NaN: none, it orders with nothing)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value)
    else:
        try:
            number = float(str(value))
        except ValueError:
            return None
    return None if math.isnan(number) else number


def shown(value: Cell, column: Column) -> str:
    """shown: a cell as the table shows it: elapsed as a duration, reported values in six
    significant digits, `-` for none."""
    if value is None:
        return "-"
    if column.name == "elapsed" and isinstance(value, int | float):
        return duration(value)
    if column.kind == "latest" and isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def members_table(columns: Sequence[Column], rows: Sequence[Row]) -> Table:
    """members_table: the rows as a rich table, a column each, every cell inert and the stage
    in its colour."""
    table = Table(box=None, header_style="bold")
    for column in columns:
        numeric = column.name in ("index", "elapsed", "exit_code", "step")
        table.add_column(
            inert_markup(column.name.upper() if column.kind == "fixed" else column.name),
            justify="right" if numeric or column.kind == "latest" else "left",
            no_wrap=True,
        )
    for row in rows:
        cells: list[Text] = []
        for column in columns:
            text = inert(shown(row.get(column.name), column))
            style = STAGE_STYLE.get(text, "") if column.name == "stage" else ""
            cells.append(Text(text, style=style))
        table.add_row(*cells)
    return table


def header_rows(summary: job_pb2.ExperimentSummary, now: float) -> list[tuple[str, str]]:
    """header_rows: what the experiment is, as (label, plain text) pairs: its name and id,
    owner, queue, members (points x seeds), how many are in each stage and how many ended
    each way, maxParallel, seeds, parameters and when it was submitted."""
    seeds = max(summary.seeds, 1)
    outcomes = ", ".join(f"{n} {o}" for o, n in sorted(summary.outcomes.items()) if n)
    submitted = seconds_of(summary.submit_time)
    rows = [
        ("Name", f"{summary.name}  (id {summary.id})"),
        ("Owner", summary.owner or "-"),
        ("Queue", summary.queue),
        ("Members", f"{summary.members} ({summary.members // seeds} points x {seeds} seeds)"),
        ("Stages", stage_counts(summary.stages)),
        ("Outcomes", outcomes or "-"),
        ("maxParallel", str(summary.max_parallel) if summary.max_parallel else "none"),
        ("Seeds", str(summary.seeds)),
        ("Parameters", ", ".join(summary.parameters) or "-"),
        ("Submitted", "-" if submitted is None else f"{duration(now - submitted)} ago"),
    ]
    if summary.deleted:
        rows.append(("Deleted", "yes"))
    return rows


def document(
    experiment: job_pb2.Experiment, columns: Sequence[Column], rows: Sequence[Row]
) -> dict[str, Any]:
    """document: what `-o json|yaml` prints: the summary's fields (camelCase, each always
    there: `members` a count, `stages` and `outcomes` counts by name, `submitTime` unix
    seconds or null), `columns` (their names, in order) and `rows` (one per member, in the
    order given, keyed by column name, plus `notes`: the texts the member published)."""
    s = experiment.summary
    notes = {m.index: dict(m.notes) for m in experiment.members}
    return {
        "name": s.name,
        "id": s.id,
        "owner": s.owner,
        "queue": s.queue,
        "submitTime": seconds_of(s.submit_time),
        "members": s.members,
        "seeds": s.seeds,
        "maxParallel": s.max_parallel,
        "parameters": list(s.parameters),
        "stages": dict(s.stages),
        "outcomes": dict(s.outcomes),
        "deleted": s.deleted,
        "columns": [c.name for c in columns],
        "rows": [{**row, "notes": notes.get(_int(row["index"]), {})} for row in rows],
    }


def _int(value: Cell) -> int:
    return value if isinstance(value, int) else -1


def write_csv(columns: Sequence[Column], rows: Sequence[Row], out: TextIO) -> None:
    """write_csv: a header of the column names, then a line per row; none is an empty cell,
    elapsed is seconds (3 decimals), and each text is inert and never read as a formula, as
    `history`'s CSV is (see inert.csv_text)."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([csv_text(c.name) for c in columns])
    for row in rows:
        writer.writerow(_csv_cell(row.get(c.name), c) for c in columns)
    out.flush()


def _csv_cell(value: Cell, column: Column) -> str:
    if value is None:
        return ""
    if column.name == "elapsed" and isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, float):
        return repr(value)
    return csv_text(str(value))


def counts_line(stages: Mapping[str, int], members: int) -> str:
    """counts_line: `12 members: 3 Running, 5 Pending, 4 Succeeded`."""
    return f"{members} member{'s' if members != 1 else ''}: {stage_counts(stages)}"
