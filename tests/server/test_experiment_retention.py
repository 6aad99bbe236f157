"""Retention prunes an experiment's members together, once all are due: a member pruned
while another still ran would count as Deleted, and a job waiting for the experiment to
succeed would fail DependencyNeverMet though every member completed."""

from __future__ import annotations

from dataclasses import replace

from arranger.server import lifecycle, retention
from arranger.server.controller import Controller, ControllerConfig
from arranger.server.convert import spec_to_json
from arranger.server.dependencies import experiment_ended_as
from arranger.server.effects import Effects
from arranger.server.model import ExperimentRecord
from arranger.server.validation import parse_job
from arranger.spec import Dependency
from arranger.states import Stage
from arranger.sweep import Members
from tests.server.test_experiments import sweep

DAY = 86_400.0


def complete(c: Controller, name: str, now: float) -> None:
    job = c.view.find(name)
    fx = Effects()
    lifecycle.finish(c, job, Stage.SUCCEEDED, "Completed", "its leader exited 0", now, fx)
    c.settle(fx, now)


def test_a_job_waiting_for_an_experiment_whose_early_members_were_pruned_still_runs() -> None:
    c = Controller(ControllerConfig())
    spec = parse_job(sweep("long", {"lr": [1, 2]}, maxParallel=1))
    make = Members(spec)
    specs = [(f"m{i}", make.spec_of(i), spec_to_json(make.spec_of(i))) for i in range(2)]
    exp = ExperimentRecord("e1", spec, spec_to_json(spec), 100.0, "")
    c.submit_experiment(exp, specs, 100.0)
    after = parse_job(sweep("x", {}))  # any spec; its sweep dropped below
    after = replace(after, name="after", sweep=None, depends_on=(Dependency("e1", "succeeded"),))
    waiting, _ = c.submit("a1", after, spec_to_json(after), 100.0)
    assert waiting.waiting

    complete(c, "long-0", 200.0)  # member 0 completed; member 1 takes its turn and runs long
    now = 200.0 + 31 * DAY
    _, taken = retention.prune(c, now, 30 * DAY, 365 * DAY, 500)
    assert taken == 0 and c.view.find("long-0") is not None  # kept while long-1 runs
    complete(c, "long-1", now + 1)
    assert experiment_ended_as(exp, c.jobs) == "Completed"
    assert not waiting.waiting and waiting.reason == "Submitted"
    _, taken = retention.prune(c, now + 31 * DAY, 30 * DAY, 365 * DAY, 500)
    assert taken == 2  # both, once both are due
