"""dashboard_experiments: what the dashboard shows of experiments, read from the controller's
view and the reported values (reports).

Pure: records in, plain rows and JSON out; the templates and the chart script (static/
experiment.js) only lay them out. Who sees what follows the API's rules (experiment_calls):
an experiment, its members and their stages are shown to everyone; the sweep's values and
the members' reported values to its owner and admins only (others see them hidden). Deleted
members are left out, as the API leaves them out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from arranger.identity import Principal
from arranger.server.access import REDACTED
from arranger.server.dashboard_pages import MAX_JOBS_SHOWN, JobRow, job_row, member_index
from arranger.server.model import ExperimentRecord, JobRecord
from arranger.server.reports import ReportBook, thin
from arranger.server.view import ClusterView

# The chart's JSON carries at most about this many points in all: each member's series (at
# most reports.MAX_POINTS points of reports.MAX_KEYS keys) is thinned evenly to its share.
MAX_CHART_POINTS = 100_000


@dataclass(frozen=True)
class ExperimentRow:
    """ExperimentRow: one experiment as the jobs page lists it (folded: its members counted
    by stage, not listed)."""

    id: str
    name: str
    owner: str
    queue: str
    members: int  # not deleted
    stages: dict[str, int]
    submit_time: float


@dataclass(frozen=True)
class MemberRow:
    """MemberRow: one member on its experiment's page; `values` are its value of each of the
    page's `columns` (REDACTED for a caller who may not read them), `latest` its newest value
    of each of the page's `keys` (None: it reported none)."""

    index: int
    job: JobRow
    values: tuple[str, ...]
    elapsed: str  # "-": it has not started
    exit_code: int | None  # the leader's
    step: int | None  # of its latest report (None: it reported nothing)
    latest: tuple[float | None, ...]


@dataclass(frozen=True)
class ExperimentPage:
    """ExperimentPage: an experiment's header and its members, by index. `parameters` holds
    each parameter's values (none for a caller who may not read them); `columns` names the
    values shown of each member (the parameters, then `seed`); `keys` the reported keys,
    sorted (none for such a caller)."""

    id: str
    name: str
    owner: str
    queue: str
    submit_time: float
    max_parallel: int
    seeds: int
    parameters: tuple[tuple[str, tuple[str, ...]], ...]
    stages: dict[str, int]
    outcomes: dict[str, int]
    private: bool  # the caller may read the sweep's values and the reported values
    columns: tuple[str, ...]
    keys: tuple[str, ...]
    members: tuple[MemberRow, ...]


def may_read_values(caller: Principal, exp: ExperimentRecord) -> bool:
    """may_read_values: whether the caller may read the experiment's sweep values and its
    members' reported values (its owner and admins)."""
    return caller.owns(exp.owner)


def experiment_rows(view: ClusterView, stage: str = "", owner: str = "") -> list[ExperimentRow]:
    """experiment_rows: the experiments not deleted, newest first (at most MAX_JOBS_SHOWN), of
    this owner when given, with a member of this stage when given ("active": an unfinished
    member); a walk over every experiment."""
    rows = []
    for exp in view.experiments():
        if owner and exp.owner != owner:
            continue
        jobs = [job for job in view.members(exp) if not job.deleted]
        if not jobs or not any(_in_stage(job, stage) for job in jobs):
            continue
        rows.append(
            ExperimentRow(
                exp.id,
                exp.name,
                exp.owner,
                exp.spec.queue,
                len(jobs),
                _count(job.stage.value for job in jobs),
                exp.submit_time,
            )
        )
    rows.sort(key=lambda r: (r.submit_time, r.id), reverse=True)
    return rows[:MAX_JOBS_SHOWN]


def experiment_page(
    exp: ExperimentRecord,
    jobs: Sequence[JobRecord],
    caller: Principal,
    reports: ReportBook,
    now: float,
) -> ExperimentPage:
    """experiment_page: the experiment's page for this caller (see the module); `jobs` are
    its members by index, `now` ends the elapsed time of those still running."""
    sweep = exp.spec.sweep
    assert sweep is not None
    private = may_read_values(caller, exp)
    jobs = [job for job in jobs if not job.deleted]
    columns = (*(name for name, _ in sweep.parameters), "seed")
    keys = sorted({key for job in jobs for key in _latest(reports, job)}) if private else []
    members = []
    for job in jobs:
        own = job.spec.sweep.own_values() if job.spec.sweep is not None else {}
        found = reports.of(job.id) if private else None
        latest = _latest(reports, job) if private else {}
        row = job_row(job)
        members.append(
            MemberRow(
                row.member,
                row,
                tuple(own.get(c, "-") if private else REDACTED for c in columns),
                elapsed_text(_elapsed_s(job, now)),
                job.leader.exit_code,
                found.step if found is not None else None,
                tuple(latest.get(key) for key in keys),
            )
        )
    rows = [m.job for m in members]
    return ExperimentPage(
        exp.id,
        exp.name,
        exp.owner,
        exp.spec.queue,
        exp.submit_time,
        sweep.max_parallel,
        sweep.seeds,
        tuple((name, values if private else ()) for name, values in sweep.parameters),
        _count(r.stage for r in rows),
        _count(r.outcome for r in rows if r.outcome),
        private,
        columns,
        tuple(keys),
        tuple(members),
    )


def chart_data(exp: ExperimentRecord, jobs: Sequence[JobRecord], reports: ReportBook) -> Any:
    """chart_data: what the page's charts draw, as JSON: the keys reported (sorted), and for
    each member not deleted that reported (by index) its name, a label of its values, and
    each key's series {steps, values}, thinned so that all hold about MAX_CHART_POINTS points
    at most. Only for a caller who may read the values (may_read_values)."""
    found = [(job, r) for job in jobs if not job.deleted and (r := reports.of(job.id))]
    count = sum(len(r.series) for _, r in found)
    keep = max(2, MAX_CHART_POINTS // count) if count else 0
    members: list[dict[str, Any]] = []
    for job, r in found:
        own = job.spec.sweep.own_values() if job.spec.sweep is not None else {}
        own.pop("index", None)
        series = {}
        for key, s in sorted(r.series.items()):
            steps, values = thin(s.steps, s.values, keep)
            series[key] = {"steps": steps, "values": values}
        members.append(
            {
                "index": member_index(job),
                "id": job.id,
                "name": job.name,
                "label": " ".join(f"{k}={v}" for k, v in own.items()),
                "series": series,
            }
        )
    keys = sorted({key for member in members for key in member["series"]})
    return {"id": exp.id, "name": exp.name, "keys": keys, "members": members}


def elapsed_text(seconds: float | None) -> str:
    """elapsed_text: a duration as a person reads it ("1h 02m", "3m 05s", "7s"; "-": none)."""
    if seconds is None:
        return "-"
    whole = max(0, int(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def _elapsed_s(job: JobRecord, now: float) -> float | None:
    """_elapsed_s: from the job's start to its finish (now while it has not finished)."""
    if job.start_time is None:
        return None
    end = job.finish_time if job.stage.finished and job.finish_time is not None else now
    return end - job.start_time


def _latest(reports: ReportBook, job: JobRecord) -> dict[str, float]:
    found = reports.of(job.id)
    return found.latest() if found is not None else {}


def _in_stage(job: JobRecord, stage: str) -> bool:
    """_in_stage: whether the job is of the stage ("": any; "active": not finished)."""
    if stage == "active":
        return not job.stage.finished
    return stage in ("", job.stage.value)


def _count(items: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return counts
