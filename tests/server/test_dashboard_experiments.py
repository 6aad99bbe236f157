"""dashboard_experiments: an experiment's page, its charts' data and the jobs page's folded
listing, built from a real Controller driven by its stimuli and a ReportBook."""

from __future__ import annotations

import pytest

from arranger.client.specfile import load_job_yaml
from arranger.identity import Principal, Role
from arranger.sched import JobDecision, Placement, Plan
from arranger.server import dashboard_experiments
from arranger.server.access import REDACTED
from arranger.server.controller import Controller
from arranger.server.convert import spec_to_json
from arranger.server.dashboard_experiments import (
    chart_data,
    elapsed_text,
    experiment_page,
    experiment_rows,
    thin,
)
from arranger.server.dashboard_pages import job_page, job_rows
from arranger.server.model import ExperimentRecord, JobRecord
from arranger.server.nodes import NodeRegistration, PodReport
from arranger.server.reports import JobReports, ReportBook, Series
from arranger.server.usage import UsageBook
from arranger.server.validation import parse_job
from arranger.states import PodState, ScheduleState
from arranger.sweep import Members

SWEEP = """
metadata: {{name: {name}}}
spec:
  leader: {{name: learner, template: {{command: [l, "--lr={{lr}}"]}}}}
  workerSets: []
  minWorkersNum: 0
  restartLimit: 0
  sweep: {{parameters: {{lr: [0.1, 0.01], act: [relu]}}, seeds: 2, maxParallel: 3}}
"""
ALICE = Principal("alice")
BOB = Principal("bob")
ADMIN = Principal("root", Role.ADMIN)


class World:
    """World: a controller with one node, a clock, and a book of reported values."""

    def __init__(self) -> None:
        self.c = Controller()
        self.view = self.c.view
        self.book = ReportBook()
        self.now = 100.0
        self.c.node_registered(NodeRegistration("n", "10.0.0.1", 8000, 2**33), self.now)

    def experiment(self, name: str = "sweep", owner: str = "alice") -> ExperimentRecord:
        self.now += 1.0
        spec = parse_job(load_job_yaml(SWEEP.format(name=name)))
        make = Members(spec)
        assert spec.sweep is not None
        specs = []
        for i in range(spec.sweep.size):
            member = make.spec_of(i)
            specs.append((f"{name}-id{i}", member, spec_to_json(member)))
        exp = ExperimentRecord(f"{name}-exp", spec, spec_to_json(spec), self.now, owner)
        self.c.submit_experiment(exp, specs, self.now)
        return exp

    def members(self, exp: ExperimentRecord) -> list[JobRecord]:
        return self.view.members(exp)

    def run(self, job: JobRecord) -> None:
        placements = [Placement(job.id, pod, "n") for pod in job.pods]
        decision = JobDecision(job.id, ScheduleState.SCHEDULED_SUCCEED)
        self.c.apply_plan(Plan(placements, {job.id: decision}), self.now)
        self.report_pod(job, PodState.RUNNING)

    def report_pod(self, job: JobRecord, state: PodState, exit_code: int | None = None) -> None:
        pod = job.leader
        ports = {job.spec.leader.ports[0]: 5000} if state == PodState.RUNNING else {}
        report = PodReport(pod.uid, pod.attempt, state, exit_code=exit_code, ports=ports)
        self.c.pod_reports("n", [report], self.now)

    def report(self, job: JobRecord, step: int, **values: float) -> None:
        """report keeps these values at this step, as ReportValues would."""
        found = self.book.of(job.id) or JobReports()
        for key, value in values.items():
            found.series.setdefault(key, Series()).add(step, value)
        found.step = step
        self.book.put(job.id, found)


def test_the_owner_sees_each_members_values_step_and_latest_reports() -> None:
    w = World()
    exp = w.experiment()
    jobs = w.members(exp)
    w.report(jobs[0], 1, loss=2.0, reward=0.5)
    w.report(jobs[0], 2, loss=1.5)
    w.report(jobs[3], 7, accuracy=0.25)
    page = experiment_page(exp, jobs, ALICE, w.book, w.now)
    assert page.private and page.name == "sweep" and page.owner == "alice"
    assert (page.seeds, page.max_parallel) == (2, 3)
    assert page.parameters == (("act", ("relu",)), ("lr", ("0.1", "0.01")))
    assert page.columns == ("act", "lr", "seed")
    assert page.keys == ("accuracy", "loss", "reward")  # every member's, sorted
    assert [m.index for m in page.members] == [0, 1, 2, 3]
    assert [m.job.name for m in page.members] == [f"sweep-{i}" for i in range(4)]
    assert [m.values for m in page.members] == [
        ("relu", "0.1", "0"),
        ("relu", "0.1", "1"),
        ("relu", "0.01", "0"),
        ("relu", "0.01", "1"),
    ]
    first, second, _, last = page.members
    assert first.latest == (None, 1.5, 0.5) and first.step == 2
    assert last.latest == (0.25, None, None) and last.step == 7
    assert second.latest == (None, None, None) and second.step is None
    assert page.stages == {"Pending": 4} and page.outcomes == {}
    assert experiment_page(exp, jobs, ADMIN, w.book, w.now) == page  # an admin's too


def test_another_user_sees_the_members_stages_but_no_values() -> None:
    w = World()
    exp = w.experiment()
    jobs = w.members(exp)
    w.run(jobs[1])
    w.report(jobs[1], 1, loss=2.0)
    page = experiment_page(exp, jobs, BOB, w.book, w.now)
    assert not page.private
    assert page.parameters == (("act", ()), ("lr", ()))  # the names, not the values
    assert page.columns == ("act", "lr", "seed") and page.keys == ()
    assert all(m.values == (REDACTED,) * 3 for m in page.members)
    assert all(m.latest == () and m.step is None for m in page.members)
    assert [m.job.stage for m in page.members] == ["Pending", "Running", "Pending", "Pending"]
    assert page.stages == {"Pending": 3, "Running": 1}


def test_elapsed_runs_until_a_member_finishes_and_its_exit_code_shows() -> None:
    w = World()
    exp = w.experiment()
    jobs = w.members(exp)
    assert experiment_page(exp, jobs, ALICE, w.book, w.now).members[0].elapsed == "-"
    w.run(jobs[0])
    w.run(jobs[1])
    w.now += 65.0
    page = experiment_page(exp, jobs, ALICE, w.book, w.now)
    assert page.members[0].elapsed == "1m 05s" and page.members[0].exit_code is None
    w.report_pod(jobs[0], PodState.SUCCEEDED, exit_code=0)
    w.report_pod(jobs[1], PodState.FAILED, exit_code=3)
    w.now += 600.0  # a finished member's time stops at its finish
    page = experiment_page(exp, jobs, ALICE, w.book, w.now)
    assert [m.job.stage for m in page.members[:2]] == ["Succeeded", "Failed"]
    assert page.members[0].elapsed == "1m 05s"
    assert [m.exit_code for m in page.members] == [0, 3, None, None]
    assert page.outcomes == {"Completed": 1, "Failed": 1}


def test_deleted_members_are_left_out() -> None:
    w = World()
    exp = w.experiment()
    jobs = w.members(exp)
    w.report(jobs[0], 1, loss=1.0)
    w.c.delete(jobs[0], w.now)
    page = experiment_page(exp, jobs, ALICE, w.book, w.now)
    assert [m.index for m in page.members] == [1, 2, 3] and page.keys == ()
    assert chart_data(exp, jobs, w.book)["members"] == []
    assert experiment_rows(w.view)[0].members == 3


def test_chart_data_has_each_reporting_members_series_by_key() -> None:
    w = World()
    exp = w.experiment()
    jobs = w.members(exp)
    for step in range(3):
        w.report(jobs[0], step, loss=1.0 / (step + 1), reward=float(step))
    w.report(jobs[2], 5, loss=0.5)
    data = chart_data(exp, jobs, w.book)
    assert data["id"] == exp.id and data["name"] == "sweep"
    assert data["keys"] == ["loss", "reward"]
    assert [(m["index"], m["name"], m["label"]) for m in data["members"]] == [
        (0, "sweep-0", "act=relu lr=0.1 seed=0"),
        (2, "sweep-2", "act=relu lr=0.01 seed=0"),
    ]  # members that reported nothing have no lines
    first, third = data["members"]
    assert first["series"]["reward"] == {"steps": [0, 1, 2], "values": [0.0, 1.0, 2.0]}
    assert third["series"] == {"loss": {"steps": [5], "values": [0.5]}}


def test_chart_data_thins_every_series_to_its_share_of_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dashboard_experiments, "MAX_CHART_POINTS", 20)
    w = World()
    exp = w.experiment()
    jobs = w.members(exp)
    for job in jobs:
        for step in range(100):
            w.report(job, step, loss=float(step), reward=-float(step))
    data = chart_data(exp, jobs, w.book)
    for member in data["members"]:
        for series in member["series"].values():  # 8 series: 2 points each at most
            assert series["steps"] == [0, 99]
    monkeypatch.setattr(dashboard_experiments, "MAX_CHART_POINTS", 80)
    steps = chart_data(exp, jobs, w.book)["members"][0]["series"]["loss"]["steps"]
    assert len(steps) == 10 and steps[0] == 0 and steps[-1] == 99


def test_thin_keeps_the_ends_and_spreads_the_rest_evenly() -> None:
    steps, values = list(range(10)), [float(s) for s in range(10)]
    assert thin(steps, values, 20) == (steps, values)
    assert thin(steps, values, 4) == ([0, 3, 6, 9], [0.0, 3.0, 6.0, 9.0])
    assert thin(steps, values, 2) == ([0, 9], [0.0, 9.0])
    assert thin([], [], 2) == ([], [])


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (-1.0, "0s"), (7.9, "7s"), (65.0, "1m 05s"), (3_725.0, "1h 02m")],
)
def test_elapsed_text(seconds: float | None, text: str) -> None:
    assert elapsed_text(seconds) == text


def test_the_jobs_page_folds_members_into_their_experiments() -> None:
    w = World()
    old = w.experiment("old", owner="alice")
    new = w.experiment("new", owner="bob")
    w.now += 1.0
    spec = parse_job(
        load_job_yaml("metadata: {name: lone}\nspec: {leader: {name: l, template: {command: [x]}}}")
    )
    w.c.submit("lone-id", spec, spec_to_json(spec), w.now, "alice")
    w.run(w.members(new)[0])
    assert [r.name for r in job_rows(w.view, fold=True)] == ["lone"]
    unfolded = job_rows(w.view)
    assert len(unfolded) == 9
    member = next(r for r in unfolded if r.name == "old-1")
    assert (member.experiment, member.experiment_name, member.member) == (old.id, "old", 1)
    lone = unfolded[0]
    assert (lone.experiment, lone.experiment_name) == ("", "")

    rows = experiment_rows(w.view)
    assert [(r.name, r.owner, r.members) for r in rows] == [("new", "bob", 4), ("old", "alice", 4)]
    assert rows[0].stages == {"Pending": 3, "Running": 1} and rows[1].stages == {"Pending": 4}
    assert [r.name for r in experiment_rows(w.view, owner="alice")] == ["old"]
    assert [r.name for r in experiment_rows(w.view, stage="Running")] == ["new"]
    assert [r.name for r in experiment_rows(w.view, stage="active")] == ["new", "old"]
    assert experiment_rows(w.view, stage="Failed") == []


def test_a_members_job_page_names_its_experiment() -> None:
    w = World()
    exp = w.experiment()
    job = w.members(exp)[2]
    page = job_page(job, BOB, UsageBook())
    assert (page.job.experiment, page.job.experiment_name, page.job.member) == (exp.id, "sweep", 2)
