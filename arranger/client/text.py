"""text renders jobs as plain lines, without rich: what `arranger list` prints into a pipe, and
the small formatters (ages, cut messages) the rich tables share."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any

from google.protobuf.message import Message

from arranger.client.inert import inert
from arranger.v1 import job_pb2

STAGE_STYLE = {
    "Pending": "yellow",
    "Starting": "cyan",
    "Running": "green",
    "Rescheduling": "magenta",
    "Succeeded": "bold green",
    "Failed": "bold red",
}
JOB_COLUMNS = (
    "NAME",
    "ID",
    "OWNER",
    "QUEUE",
    "PRI",
    "STAGE",
    "OUTCOME",
    "SCHEDULE",
    "WORKERS",
    "RESTARTS",
    "AGE",
    "MESSAGE",
)
STAGE_COLUMN = JOB_COLUMNS.index("STAGE")


def age(seconds: float) -> str:
    """age: a duration in its largest whole unit (`3d`, `5h`, `12m`, `40s`); `-` below zero."""
    if seconds < 0:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def seconds_of(ts: Any) -> float | None:
    """seconds_of: a Timestamp as unix seconds, None when it is unset."""
    if not ts.seconds and not ts.nanos:
        return None
    return float(ts.seconds + ts.nanos / 1e9)


def since(ts: Any, now: float | None = None) -> str:
    """since: the age of a Timestamp (`-` when unset)."""
    when = seconds_of(ts)
    if when is None:
        return "-"
    return age((time.time() if now is None else now) - when)


def duration(seconds: float) -> str:
    """duration: a length of time in its two largest units (`45s`, `12m03s`, `3h05m`, `2d04h`)."""
    s = max(0, int(seconds))
    for big, big_s, small, small_s in (
        ("d", 86400, "h", 3600),
        ("h", 3600, "m", 60),
        ("m", 60, "s", 1),
    ):
        if s >= big_s:
            return f"{s // big_s}{big}{(s % big_s) // small_s:02d}{small}"
    return f"{s}s"


def clock(ts: Any, now: float | None = None) -> str:
    """clock: a Timestamp as local time, `HH:MM:SS` on the day of `now`, `YYYY-MM-DD HH:MM`
    before it (`-` when unset)."""
    when = seconds_of(ts)
    if when is None:
        return "-"
    today = time.localtime(time.time() if now is None else now)[:3]
    local = time.localtime(when)
    return time.strftime("%H:%M:%S" if local[:3] == today else "%Y-%m-%d %H:%M", local)


def elapsed(start: Any, finish: Any, now: float | None = None) -> str:
    """elapsed: how long something ran, from its start Timestamp to its finish, or to now while
    it runs (`-` before it started)."""
    began = seconds_of(start)
    if began is None:
        return "-"
    ended = seconds_of(finish)
    return duration((ended if ended is not None else time.time() if now is None else now) - began)


def short(text: str, limit: int = 60) -> str:
    """short: text cut to `limit` characters, an ellipsis last where it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def jobs_lines(
    jobs: Sequence[job_pb2.JobSummary],
    color: bool = False,
    experiments: Sequence[job_pb2.ExperimentSummary] = (),
) -> Iterator[str]:
    """jobs_lines: a header and one line per job, columns padded to their widest cell (the
    message last, cut to 60 characters), every cell the server sent inert; with `color`, rich
    markup (other cells escaped). Each of `experiments` is one line among them, in submit time
    order (see experiment_cells)."""
    now = time.time()
    rows: list[tuple[str, ...]] = [JOB_COLUMNS]
    if experiments:
        dated = [
            (seconds_of(j.submit_time) or 0.0, n, job_cells(j, now)) for n, j in enumerate(jobs)
        ]
        dated += [
            (seconds_of(e.submit_time) or 0.0, len(jobs) + n, experiment_cells(e, now))
            for n, e in enumerate(experiments)
        ]
        rows += [cells for _, _, cells in sorted(dated)]
    else:
        rows += [job_cells(job, now) for job in jobs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(JOB_COLUMNS) - 1)]
    if color:
        from rich.markup import escape  # noqa: PLC0415 (only a terminal needs rich)
    for n, row in enumerate(rows):
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        cells.append(row[-1])
        if color:
            cells = [escape(cell) for cell in cells]
            style = STAGE_STYLE.get(row[STAGE_COLUMN], "") if n else "bold"
            if style:
                cells[STAGE_COLUMN] = f"[{style}]{cells[STAGE_COLUMN]}[/]"
        yield "  ".join(cells).rstrip()


def job_cells(job: job_pb2.JobSummary, now: float) -> tuple[str, ...]:
    """job_cells: a job's cells in JOB_COLUMNS, each inert."""
    pr = job.progress
    return (
        inert(job.name),
        inert(job.id),
        inert(job.owner or "-"),
        inert(job.queue),
        str(job.priority),
        inert(pr.stage),
        inert(pr.outcome or "-"),
        inert(pr.schedule_state),
        f"{pr.running_workers}/{job.workers}",
        str(pr.restarts),
        since(job.submit_time, now),
        short(inert(pr.message)),
    )


def experiment_cells(experiment: job_pb2.ExperimentSummary, now: float) -> tuple[str, ...]:
    """experiment_cells: an experiment's cells in JOB_COLUMNS, each inert: its name, id, owner,
    queue and age, and as its message how many members it has and how many are in each stage
    (`experiment of 12: 3 Running, 5 Pending, 4 Succeeded`); a job's other columns are `-`."""
    members = f"experiment of {experiment.members}: {stage_counts(experiment.stages)}"
    return (
        inert(experiment.name),
        inert(experiment.id),
        inert(experiment.owner or "-"),
        inert(experiment.queue),
        *("-",) * 6,
        since(experiment.submit_time, now),
        inert(members),
    )


# The order stage_counts names stages in: what moves first, then what waits, then the ended.
COUNTED_STAGES = ("Running", "Starting", "Rescheduling", "Pending", "Succeeded", "Failed")


def stage_counts(counts: Mapping[str, int]) -> str:
    """stage_counts: how many are in each stage, `3 Running, 5 Pending, 2 Succeeded`, in
    COUNTED_STAGES' order (any other stage after them, by name); stages with none are left out,
    and `none` is all there is when every count is 0."""
    order = {stage: n for n, stage in enumerate(COUNTED_STAGES)}
    named = sorted((order.get(s, len(order)), s) for s, n in counts.items() if n > 0)
    return ", ".join(f"{counts[s]} {s}" for _, s in named) or "none"


# Fields printed whole once set, by message: each of their false or empty values is an answer
# (a node's agent enforces no GPU shares: `enforced: false`), not something left unsaid, which is
# all proto3's JSON means by leaving a field out.
WHOLE_FIELDS = {"arranger.v1.Node": ("gpu_sharing",)}


# Messages whose GPU index is printed even when it is 0 (proto3's JSON leaves a zero out, so
# GPU 0 would read as no index at all), wherever they are nested.
INDEXED = frozenset({"arranger.v1.Gpu", "arranger.v1.GpuAssignment", "arranger.v1.GpuUsage"})
_HOLDS_INDEXED: dict[str, bool] = {}


def as_dict(msg: Message) -> dict[str, Any]:
    """as_dict: a message as JSON-shaped data, with the proto's JSON (camelCase) field names.
    A field of WHOLE_FIELDS that is set shows every one of its own fields; a message of INDEXED
    shows its `index` always."""
    from google.protobuf import json_format  # noqa: PLC0415

    plain = json_format.MessageToDict(msg, preserving_proto_field_name=False)
    for name in WHOLE_FIELDS.get(msg.DESCRIPTOR.full_name, ()):
        if msg.HasField(name):
            field = msg.DESCRIPTOR.fields_by_name[name]
            plain[field.json_name] = json_format.MessageToDict(
                getattr(msg, name), always_print_fields_with_no_presence=True
            )
    _show_indices(msg, plain)
    return plain


def _holds_indexed(descriptor: Any, seen: frozenset[str] = frozenset()) -> bool:
    """_holds_indexed: whether a message of this type may hold one of INDEXED (memoised)."""
    name = descriptor.full_name
    if name not in _HOLDS_INDEXED:
        if name in INDEXED:
            found = True
        else:
            found = any(
                f.message_type is not None
                and f.message_type.full_name not in seen
                and _holds_indexed(f.message_type, seen | {name})
                for f in descriptor.fields
            )
        if seen:
            return found
        _HOLDS_INDEXED[name] = found
    return _HOLDS_INDEXED[name]


def _show_indices(msg: Message, plain: dict[str, Any]) -> None:
    """_show_indices sets `index` in the JSON of every INDEXED message nested in msg."""
    descriptor = msg.DESCRIPTOR
    if descriptor.full_name in INDEXED:
        if "index" not in plain:  # left out: it is 0; shown first, as the proto orders it
            shown = {"index": 0, **plain}
            plain.clear()
            plain.update(shown)
        return
    if not _holds_indexed(descriptor):
        return
    for field in descriptor.fields:
        kind = field.message_type
        if kind is None or kind.GetOptions().map_entry or field.json_name not in plain:
            continue
        if not _holds_indexed(kind):
            continue
        value = getattr(msg, field.name)
        if isinstance(value, Message):
            _show_indices(value, plain[field.json_name])
        else:
            for item, item_plain in zip(value, plain[field.json_name], strict=True):
                _show_indices(item, item_plain)


def write_plain(data: Message | Sequence[Message], output: str, file: IO[str]) -> None:
    """write_plain writes data (a message, or a list of them) as JSON or YAML for a program:
    without the highlighting that costs seconds on a long list."""
    plain: Any = as_dict(data) if isinstance(data, Message) else [as_dict(m) for m in data]
    if output == "json":
        import json  # noqa: PLC0415

        file.write(json.dumps(plain, indent=2) + "\n")
    else:
        import yaml  # noqa: PLC0415

        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's, where PyYAML has it
        file.write(yaml.dump(plain, Dumper=dumper, sort_keys=False))
    file.flush()
