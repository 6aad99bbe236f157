"""Dependencies in the controller alone: a held job stays held across a load of the store
(its hold is derived, not stored), and a stop of the job it waits for releases or fails it in
the same change, and what waits on that in turn."""

from __future__ import annotations

import copy
from dataclasses import replace

from arranger.client.specfile import load_job_yaml
from arranger.server.controller import Controller, ControllerConfig
from arranger.server.convert import spec_to_json
from arranger.server.effects import Effects
from arranger.server.model import JobRecord
from arranger.server.validation import parse_job
from arranger.spec import Dependency

SPEC = """
metadata: {{name: {name}}}
spec:
  leader: {{name: learner, template: {{command: [l]}}}}
"""


def submit(c: Controller, job_id: str, *needs: tuple[str, str]) -> tuple[JobRecord, Effects]:
    spec = parse_job(load_job_yaml(SPEC.format(name=job_id)))
    spec = replace(spec, depends_on=tuple(Dependency(j, w) for j, w in needs))
    return c.submit(job_id, spec, spec_to_json(spec), 100.0)


def test_a_held_job_is_held_again_when_the_store_is_loaded() -> None:
    c = Controller(ControllerConfig())
    first, _ = submit(c, "first")
    later, _ = submit(c, "later", ("first", "succeeded"))
    assert later.waiting and later.reason == "WaitingForDependencies"
    again = Controller(ControllerConfig())
    stored = [copy.deepcopy(later), copy.deepcopy(first)]  # in any order
    for job in stored:
        job.waiting = False  # as read back: the hold is not stored
    again.restore(stored, [], 200.0)
    assert again.jobs["later"].waiting and again.waiting == {"later"}


def test_stopping_what_a_job_waits_for_settles_it_and_what_waits_on_it() -> None:
    c = Controller(ControllerConfig())
    submit(c, "first")
    ok, _ = submit(c, "ok", ("first", "succeeded"))
    any_end, _ = submit(c, "any", ("first", "finished"))
    chained, _ = submit(c, "chained", ("ok", "finished"))
    fx = c.stop(c.jobs["first"], 150.0)
    c.settle(fx, 150.0)
    assert (ok.stage.value, ok.reason) == ("Failed", "DependencyNeverMet")
    assert "ended Stopped" in ok.message
    assert not any_end.waiting and any_end.stage.value == "Pending"
    assert not chained.waiting, "ok ended (failed): `finished` is met"
    assert c.waiting == set()


def test_a_released_job_is_never_held_again_whatever_became_of_its_dependency() -> None:
    c = Controller(ControllerConfig())
    submit(c, "first")
    later, _ = submit(c, "later", ("first", "finished"))
    c.settle(c.stop(c.jobs["first"], 150.0), 150.0)
    assert not later.waiting and later.waiting_since == 150.0  # its timeout counts from here
    c.delete(c.jobs["first"], 160.0)
    again = Controller(ControllerConfig())
    stored = copy.deepcopy(later)  # `first` deleted and pruned: not stored any more
    fx = again.restore([stored], [], 200.0)
    assert not stored.waiting and stored.stage.value == "Pending" and not fx.ended


def test_a_held_job_read_back_after_a_failed_write_is_held_as_it_was() -> None:
    c = Controller(ControllerConfig())
    submit(c, "first")
    later, _ = submit(c, "later", ("first", "succeeded"))
    later.waiting = False  # as a record copied back from the store is
    c.hold_as_stored(later)
    assert later.waiting and c.waiting == {"later"} and c.waiters == {"first": {"later"}}


def test_a_held_job_stopped_is_let_go() -> None:
    c = Controller(ControllerConfig())
    submit(c, "first")
    later, _ = submit(c, "later", ("first", "succeeded"))
    c.settle(c.stop(later, 150.0), 150.0)
    assert later.stage.value == "Succeeded" and not later.waiting
    assert c.waiting == set() and c.waiters == {}
