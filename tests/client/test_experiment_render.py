"""How the CLI shows experiments without a server: the members' columns and rows, sorting by
any column, CSV and the JSON document, the folded line of `list`, the lines of `submit`, how
`submit --wait` exits, `run --sweep` and a file's sweep read into spec.sweep."""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import json
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from arranger.client.channel import ArrangerError
from arranger.client.experiment_table import (
    Row,
    columns_of,
    document,
    members_table,
    rows_of,
    sort_rows,
    write_csv,
)
from arranger.client.experiments import (
    explain_experiment,
    has_ended,
    job_or_experiment,
    show_experiment,
    submitted,
    wait_exit,
)
from arranger.client.inert import csv_text
from arranger.client.joblist import listed_experiments
from arranger.client.parser import build_parser
from arranger.client.run_command import job_document
from arranger.client.specfile import SpecFileError, load_job_yaml
from arranger.client.text import jobs_lines, stage_counts
from arranger.v1 import arranger_pb2, job_pb2

NOW = 1_000_000.0


def member(
    index: int,
    values: dict[str, str],
    stage: str = "Pending",
    start: float | None = None,
    finish: float | None = None,
    exit_code: int | None = None,
    step: int = 0,
    latest: dict[str, float] | None = None,
    name: str = "exp",
) -> job_pb2.ExperimentMember:
    m = job_pb2.ExperimentMember(
        index=index, values=values, step=step, latest=latest or {}, exit_code=exit_code
    )
    m.job.name, m.job.experiment = f"{name}-{index}", name
    m.job.progress.stage = stage
    if start is not None:
        m.job.progress.start_time.FromNanoseconds(int(start * 1e9))
    if finish is not None:
        m.job.progress.finish_time.FromNanoseconds(int(finish * 1e9))
    return m


def experiment(
    parameters: list[str], *members: job_pb2.ExperimentMember, seeds: int = 1
) -> job_pb2.Experiment:
    stages: dict[str, int] = {}
    for m in members:
        stages[m.job.progress.stage] = stages.get(m.job.progress.stage, 0) + 1
    summary = job_pb2.ExperimentSummary(
        name="exp",
        id="e1",
        owner="ann",
        queue="default",
        members=len(members),
        stages=stages,
        seeds=seeds,
        parameters=parameters,
    )
    return job_pb2.Experiment(summary=summary, members=members)


def sweep_of_three() -> job_pb2.Experiment:
    return experiment(
        ["lr"],
        member(
            2, {"lr": "1e-3", "seed": "0"}, "Running", start=NOW - 90, step=7, latest={"loss": 0.5}
        ),
        member(
            0,
            {"lr": "1e-4", "seed": "0"},
            "Succeeded",
            NOW - 300,
            NOW - 100,
            0,
            20,
            {"loss": 0.25, "return": 475.0},
        ),
        member(1, {"lr": "3e-4", "seed": "0"}, "Pending"),
    )


def names(rows: list[Row]) -> list[Any]:
    return [row["name"] for row in rows]


def test_columns_come_in_order_and_each_has_a_name_of_its_own() -> None:
    exp = experiment(
        ["lr", "stage"],
        member(
            0,
            {"lr": "1", "stage": "a", "seed": "0", "index": "0"},
            latest={"step": 1.0, "lr": 2.0, "acc": 0.5},
        ),
    )
    assert [c.name for c in columns_of(exp)] == [
        "index", "name", "lr", "values.stage", "seed", "stage", "outcome", "elapsed",
        "exit_code", "step", "acc", "latest.lr", "latest.step",
    ]  # fmt: skip


def test_rows_hold_typed_values_by_index_with_none_where_a_member_has_none() -> None:
    exp = sweep_of_three()
    rows = rows_of(exp, columns_of(exp), NOW)
    assert names(rows) == ["exp-0", "exp-1", "exp-2"]
    done, waiting, running = rows
    assert done == {
        "index": 0, "name": "exp-0", "lr": "1e-4", "seed": 0, "stage": "Succeeded",
        "outcome": None, "elapsed": 200.0, "exit_code": 0, "step": 20, "loss": 0.25,
        "return": 475.0,
    }  # fmt: skip
    assert running["elapsed"] == 90.0 and running["exit_code"] is None  # to now while it runs
    assert waiting["elapsed"] is None and waiting["step"] is None and waiting["loss"] is None


def test_sort_by_a_parameter_reads_its_values_as_numbers_and_stage_by_a_jobs_life() -> None:
    exp = sweep_of_three()
    columns = columns_of(exp)
    rows = rows_of(exp, columns, NOW)
    assert names(sort_rows(rows, columns, "lr")) == ["exp-0", "exp-1", "exp-2"]
    assert names(sort_rows(rows, columns, "-lr")) == ["exp-2", "exp-1", "exp-0"]
    assert names(sort_rows(rows, columns, "stage")) == ["exp-1", "exp-2", "exp-0"]
    # Missing values go last, ascending or descending.
    assert names(sort_rows(rows, columns, "loss")) == ["exp-0", "exp-2", "exp-1"]
    assert names(sort_rows(rows, columns, "-loss")) == ["exp-2", "exp-0", "exp-1"]
    assert names(sort_rows(rows, columns, "-ELAPSED")) == ["exp-0", "exp-2", "exp-1"]
    assert names(sort_rows(rows, columns, "-return")) == ["exp-0", "exp-1", "exp-2"]
    with pytest.raises(ValueError, match=r"--sort 'nope': no such column; the columns are index"):
        sort_rows(rows, columns, "nope")


CELLS = st.one_of(
    st.none(),
    st.integers(-5, 5),
    st.floats(-10, 10, allow_nan=False),
    st.sampled_from(["1e-4", "3e-4", "0.01", "x", "b", ""]),
)


@given(st.lists(CELLS, max_size=12), st.booleans())
def test_sort_is_a_permutation_ordered_with_missing_values_last(
    values: list[Any], descending: bool
) -> None:
    exp = experiment(["p"], member(0, {"p": "1", "seed": "0"}))
    columns = columns_of(exp)
    rows: list[Row] = [{"index": n, "name": f"exp-{n}", "p": v} for n, v in enumerate(values)]
    ranked = sort_rows(rows, columns, "-p" if descending else "p")
    assert sorted(r["index"] for r in ranked) == list(range(len(values)))
    present = [r["p"] for r in ranked if r["p"] is not None]
    assert [r["p"] for r in ranked[len(present) :]] == [None] * (len(values) - len(present))
    numeric = all(not isinstance(v, str) or _reads_as_number(v) for v in present)
    keys = [float(v) if numeric else str(v) for v in present]
    assert keys == sorted(keys, reverse=descending)
    for a, b in itertools.pairwise(ranked):  # equal values keep the index order
        if a["p"] is not None and b["p"] is not None and str(a["p"]) == str(b["p"]):
            assert a["index"] < b["index"]


def _reads_as_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def test_csv_has_a_header_and_a_row_per_member_with_empty_cells_for_none() -> None:
    exp = sweep_of_three()
    exp.members[0].values["lr"] = "1e-3\x1b[2J"  # shown written out, never acted on
    columns = columns_of(exp)
    out = io.StringIO()
    write_csv(columns, rows_of(exp, columns, NOW), out)
    lines = list(csv.reader(io.StringIO(out.getvalue())))
    assert lines[0] == [c.name for c in columns]
    assert lines[1] == ["0", "exp-0", "1e-4", "0", "Succeeded", "", "200.000", "0", "20", "0.25", "475.0"]  # fmt: skip
    assert lines[2][6] == ""  # elapsed: it never started
    assert lines[3][2] == "1e-3\\x1b[2J"
    assert len(lines) == 4


def test_the_document_holds_the_summary_columns_and_a_row_per_member() -> None:
    exp = sweep_of_three()
    exp.members[1].notes["checkpoint"] = "/ckpt/0"
    columns = columns_of(exp)
    doc = json.loads(json.dumps(document(exp, columns, rows_of(exp, columns, NOW))))
    assert doc["name"] == "exp" and doc["id"] == "e1" and doc["members"] == 3
    assert doc["stages"] == {"Running": 1, "Succeeded": 1, "Pending": 1}
    assert doc["maxParallel"] == 0 and doc["seeds"] == 1 and doc["parameters"] == ["lr"]
    assert doc["columns"] == [c.name for c in columns]
    assert [r["index"] for r in doc["rows"]] == [0, 1, 2]
    assert doc["rows"][0]["notes"] == {"checkpoint": "/ckpt/0"} and doc["rows"][1]["notes"] == {}
    assert doc["rows"][1]["elapsed"] is None and doc["rows"][0]["loss"] == 0.25


def test_show_experiment_prints_csv_json_and_a_table_sorted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    exp = sweep_of_three()
    out = Console(file=io.StringIO(), width=200)
    show_experiment(exp, argparse.Namespace(output="csv", sort="-loss"), out)
    assert [line.split(",")[1] for line in capsys.readouterr().out.splitlines()] == [
        "name", "exp-2", "exp-0", "exp-1",
    ]  # fmt: skip
    show_experiment(exp, argparse.Namespace(output="json", sort="index"), out)
    assert [r["name"] for r in json.loads(capsys.readouterr().out)["rows"]] == [
        "exp-0", "exp-1", "exp-2",
    ]  # fmt: skip
    show_experiment(exp, argparse.Namespace(output="table", sort=""), out)
    text = out.file.getvalue()
    assert "3 (3 points x 1 seeds)" in text and "1 Running, 1 Pending, 1 Succeeded" in text
    header = next(line for line in text.splitlines() if "INDEX" in line).split()
    assert header == ["INDEX", "NAME", "lr", "SEED", "STAGE", "OUTCOME", "ELAPSED", "EXIT_CODE", "STEP", "loss", "return"]  # fmt: skip
    assert "3m20s" in text and "475" in text


def test_the_members_table_shows_a_dash_for_none_and_nothing_as_markup() -> None:
    exp = experiment(["p"], member(0, {"p": "[bold]x[/]", "seed": "0"}))
    columns = columns_of(exp)
    out = Console(file=io.StringIO(), width=200)
    out.print(members_table(columns, rows_of(exp, columns, NOW)))
    row = out.file.getvalue().splitlines()[1]
    assert "[bold]x[/]" in row and row.split()[-1] == "-"


def test_stage_counts_name_what_moves_first_and_leave_out_none() -> None:
    counts = {"Succeeded": 2, "Pending": 5, "Running": 3, "Failed": 0, "Odd": 1}
    assert stage_counts(counts) == "3 Running, 5 Pending, 2 Succeeded, 1 Odd"
    assert stage_counts({}) == "none"


def test_list_folds_an_experiment_into_one_line_among_jobs_by_submit_time() -> None:
    early, late = (
        job_pb2.JobSummary(name="early", id="j1"),
        job_pb2.JobSummary(name="late", id="j2"),
    )
    early.submit_time.FromSeconds(100)
    late.submit_time.FromSeconds(300)
    exp = job_pb2.ExperimentSummary(
        name="sweep-a", id="e1", owner="ann", queue="default", members=10,
        stages={"Running": 3, "Pending": 5, "Succeeded": 2},
    )  # fmt: skip
    exp.submit_time.FromSeconds(200)
    lines = list(jobs_lines([early, late], experiments=[exp]))
    assert [line.split()[0] for line in lines] == ["NAME", "early", "sweep-a", "late"]
    assert lines[2].split()[:4] == ["sweep-a", "e1", "ann", "default"]
    assert lines[2].endswith("experiment of 10: 3 Running, 5 Pending, 2 Succeeded")


def test_list_shows_experiments_with_a_member_in_the_stages_listed() -> None:
    ended = job_pb2.ExperimentSummary(name="ended", members=2, stages={"Succeeded": 2})
    running = job_pb2.ExperimentSummary(
        name="running", members=2, stages={"Running": 1, "Failed": 1}
    )
    gone = job_pb2.ExperimentSummary(name="gone", members=1, stages={"Running": 1}, deleted=True)
    found = [ended, running, gone]
    assert [e.name for e in listed_experiments(found, ["Pending", "Running"])] == ["running"]
    assert [e.name for e in listed_experiments(found, [])] == ["ended", "running"]


def test_submit_says_how_many_members_and_wait_exits_by_their_outcomes() -> None:
    summary = job_pb2.ExperimentSummary(name="sweep-a", members=12, seeds=4, max_parallel=4)
    assert submitted(summary) == (
        "experiment [bold]sweep-a[/] submitted: 12 members (3 points x 4 seeds), maxParallel 4"
    )
    summary.max_parallel = 0
    assert submitted(summary).endswith("(3 points x 4 seeds)")
    assert not has_ended(
        job_pb2.ExperimentSummary(members=2, stages={"Succeeded": 1, "Pending": 1})
    )
    done = job_pb2.ExperimentSummary(members=2, stages={"Succeeded": 2}, outcomes={"Completed": 2})
    assert has_ended(done) and wait_exit(done) == 0
    done.outcomes["Stopped"], done.outcomes["Completed"] = 1, 1
    assert wait_exit(done) == 3
    done.stages["Failed"], done.stages["Succeeded"] = 1, 1
    assert wait_exit(done) == 1  # a failure outweighs a stop
    assert wait_exit(job_pb2.ExperimentSummary(members=1, deleted=True)) == 3


def test_a_name_means_a_job_then_an_experiment_then_the_jobs_refusal() -> None:
    def no_job(name: str) -> str:
        raise ArrangerError(grpc.StatusCode.NOT_FOUND, f"job {name!r} not found")

    def no_experiment(name: str) -> str:
        raise ArrangerError(grpc.StatusCode.NOT_FOUND, f"experiment {name!r} not found")

    def denied(name: str) -> str:
        raise ArrangerError(grpc.StatusCode.PERMISSION_DENIED, "not yours")

    assert job_or_experiment("x", lambda n: f"job {n}", no_experiment) == "job x"
    assert job_or_experiment("x", no_job, lambda n: f"experiment {n}") == "experiment x"
    with pytest.raises(ArrangerError, match="job 'x' not found"):
        job_or_experiment("x", no_job, no_experiment)
    with pytest.raises(ArrangerError, match="not yours"):
        job_or_experiment("x", no_job, denied)
    with pytest.raises(ArrangerError, match="not yours"):  # a job's own refusal is not a miss
        job_or_experiment("x", denied, lambda n: n)


def run_args(*words: str) -> argparse.Namespace:
    return build_parser("run").parse_args(["run", *words, "--", "python", "t.py", "--lr", "{lr}"])


def test_run_sweep_builds_spec_sweep_with_values_as_typed() -> None:
    doc = job_document(
        run_args("--sweep", "lr=1e-4,3e-4", "--sweep", "batch=32,064", "--seeds", "5", "--max-parallel", "4")
    )  # fmt: skip
    assert doc["spec"]["sweep"] == {
        "parameters": {"lr": ["1e-4", "3e-4"], "batch": ["32", "064"]},
        "seeds": 5,
        "maxParallel": 4,
    }
    assert job_document(run_args("--seeds", "3"))["spec"]["sweep"] == {"parameters": {}, "seeds": 3}
    assert "sweep" not in job_document(run_args())["spec"]


@pytest.mark.parametrize(
    ("words", "problem"),
    [
        (["--sweep", "lr"], "--sweep 'lr': give NAME=V1,V2,..."),
        (["--sweep", "LR=1"], "--sweep 'LR=1': the name 'LR' must be a lowercase letter"),
        (["--sweep", "lr=1,,2"], "--sweep 'lr=1,,2': every value must be non-empty"),
        (["--sweep", "lr=", "--seeds", "2"], "--sweep 'lr=': every value must be non-empty"),
        (["--sweep", "a=1", "--sweep", "a=2"], "--sweep 'a=2': a is given twice"),
        (["--seeds", "0"], "--seeds 0: must be 1 or more"),
        (["--max-parallel", "2"], "--max-parallel: only with --sweep or --seeds"),
    ],
)
def test_run_refuses_a_malformed_sweep_naming_the_flag(words: list[str], problem: str) -> None:
    with pytest.raises(SpecFileError) as refused:
        job_document(run_args(*words))
    assert f"arranger run: {problem}" in str(refused.value)


def test_a_files_sweep_takes_strings_numbers_and_booleans() -> None:
    head = "apiVersion: arranger/v1\nkind: TYJob\nmetadata: {name: s}\nspec:\n"
    leader = "  leader: {name: l, template: {command: [echo, '{lr}']}}\n"
    job = load_job_yaml(
        head + "  sweep: {parameters: {lr: [1e-4, 0.5, on, x]}, seeds: 2}\n" + leader
    )
    values = job.spec.sweep.parameters["lr"].values
    assert [v.WhichOneof("kind") for v in values] == ["string_value", "number_value", "bool_value", "string_value"]  # fmt: skip
    assert job.spec.sweep.seeds == 2
    with pytest.raises(SpecFileError) as refused:
        load_job_yaml(head + "  sweep: {parameters: {lr: 3, b: [[1]]}}\n" + leader)
    assert refused.value.problems == [
        "<job>: spec.sweep.parameters.lr: expected a list of strings, numbers or true/false "
        "values, got the number 3",
        "<job>: spec.sweep.parameters.b[0]: expected a string, a number or true/false, got a list",
    ]


class Explaining:
    """Explaining stands in for a Client: it explains any job, and remembers which."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def explain(self, name: str) -> arranger_pb2.ExplainJobResponse:
        self.asked.append(name)
        reply = arranger_pb2.ExplainJobResponse(message="waits for its turn")
        reply.job.metadata.name, reply.job.status.stage = name, "Pending"
        return reply


def test_explain_explains_the_first_pending_member_by_index(
    capsys: pytest.CaptureFixture[str],
) -> None:
    exp = experiment(
        ["lr"],
        member(3, {"lr": "1", "seed": "0"}, "Pending"),  # pending, but listed first
        member(2, {"lr": "2", "seed": "0"}, "Running"),
        member(1, {"lr": "3", "seed": "0"}, "Pending"),
        member(0, {"lr": "4", "seed": "0"}, "Succeeded"),
    )
    for m in exp.members:
        m.job.id = f"j{m.index}"
    client = Explaining()
    out = Console(file=io.StringIO(), width=200)
    explain_experiment(client, exp, "table", out)  # type: ignore[arg-type]
    text = out.file.getvalue()  # type: ignore[attr-defined]
    assert client.asked == ["j1"]
    assert text.splitlines()[0] == "experiment exp: 4 members: 1 Running, 2 Pending, 1 Succeeded"
    assert "its first pending member, exp-1 (index 1):" in text and "waits for its turn" in text
    explain_experiment(client, exp, "json", out)  # type: ignore[arg-type]
    doc = json.loads(capsys.readouterr().out)
    assert doc["member"] == "exp-1" and doc["explanation"]["message"] == "waits for its turn"
    for m in exp.members:
        m.job.progress.stage = "Running"
    out = Console(file=io.StringIO(), width=200)
    explain_experiment(client, exp, "table", out)  # type: ignore[arg-type]
    assert out.file.getvalue().splitlines()[1] == "no member is pending"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("given", "written"),
    [
        ('=HYPERLINK("http://x","y")', '\'=HYPERLINK("http://x","y")'),
        ("+cmd|' /C calc'!A0", "'+cmd|' /C calc'!A0"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("-2+3", "'-2+3"),
        ("-0.5", "-0.5"),  # a number stays a number
        ("1e-4", "1e-4"),
        ("adam", "adam"),
        ("=\x1b[31m", "'=\\x1b[31m"),  # inert as well
    ],
)
def test_a_csv_cell_is_never_read_as_a_formula(given: str, written: str) -> None:
    assert csv_text(given) == written
    out = io.StringIO()
    csv.writer(out).writerow([csv_text(given)])
    assert next(csv.reader(io.StringIO(out.getvalue())))[0] == written
