"""Helper roles: an auxiliary worker set (an evaluator, a replay buffer) is placed with the job
but never in its gang minimum nor minWorkersNum, never fails the job, runs on for its
terminationDelaySeconds once the leader has ended, and may wait for the leader's first report
(startAfter: leaderReady). The controller as a pure state machine, time injected."""

from __future__ import annotations

import pytest

from arranger.client.specfile import load_job_yaml
from arranger.sched import JobDecision, Placement, Plan
from arranger.server.controller import Controller, ControllerConfig
from arranger.server.convert import spec_from_json, spec_to_json
from arranger.server.effects import Effects
from arranger.server.nodes import NodeRegistration, PodReport
from arranger.server.validation import SpecInvalid, parse_job
from arranger.states import PodState, ScheduleState, Stage

SPEC = """
metadata: {name: rl}
spec:
  restartLimit: 1
  minWorkersNum: 2
  leader: {name: learner, template: {command: [l]}}
  workerSets:
  - {name: actors, counts: 2, template: {command: [a]}}
  - {name: evals, counts: 1, auxiliary: true, terminationDelaySeconds: 30, EXTRA template: {command: [e]}}
"""


class Lab:
    """Lab: the job above on node n1, placed whole, its leader running."""

    def __init__(self, extra: str = "") -> None:
        self.c = Controller(ControllerConfig(backoff_initial_s=1.0, backoff_max_s=8.0))
        self.now = 100.0
        self.c.node_registered(NodeRegistration("n1", "10.0.0.1", 8000, 2**33), self.now)
        spec = parse_job(load_job_yaml(SPEC.replace("EXTRA", extra)))
        self.job, _ = self.c.submit("j", spec, spec_to_json(spec), self.now)
        placements = [Placement("j", name, "n1") for name in self.job.pods]
        decision = {"j": JobDecision("j", ScheduleState.SCHEDULED_SUCCEED)}
        self.c.apply_plan(Plan(placements, decision), self.now)
        self.fx = self.report("rl-learner", PodState.RUNNING, rpc=7000)

    def report(self, name: str, state: PodState, code: int | None = None, **ports: int) -> Effects:
        pod = self.job.pods[name]
        report = PodReport(pod.uid, pod.attempt, state, pid=10, exit_code=code, ports=ports)
        self.fx = self.c.pod_reports("n1", [report], self.now)
        return self.fx

    def state(self, name: str) -> PodState:
        return self.job.pods[name].state


def launched(fx: Effects) -> list[str]:
    return sorted(o.pod_uid.split("/")[1] for o in fx.launches)


def test_an_auxiliary_set_is_not_in_the_minimum_and_its_failures_never_fail_the_job() -> None:
    lab = Lab()
    spec = lab.job.spec
    assert spec.minimum_ranks() == frozenset({0, 1}) and spec.counted_workers == 2
    assert not lab.job.pods["rl-evals-0"].in_minimum
    assert launched(lab.fx) == ["rl-actors-0", "rl-actors-1", "rl-evals-0"]  # with the gang
    lab.report("rl-actors-0", PodState.RUNNING)
    lab.report("rl-actors-1", PodState.RUNNING)
    assert lab.job.stage == Stage.RUNNING  # minWorkersNum 2 without the evaluator
    lab.report("rl-evals-0", PodState.RUNNING)
    for _ in range(2):  # past its restartLimit (1): done, and the job runs on
        lab.report("rl-evals-0", PodState.FAILED, code=1)
        lab.now += 10
        lab.c.tick(lab.now)
        if lab.state("rl-evals-0") == PodState.LAUNCHING:
            lab.report("rl-evals-0", PodState.RUNNING)
    assert lab.job.pods["rl-evals-0"].done and lab.job.set_restarts == {"evals": 1}
    assert lab.job.stage == Stage.RUNNING


def test_after_the_leader_ends_the_helpers_finish_within_their_delay() -> None:
    lab = Lab()
    for name in ("rl-actors-0", "rl-actors-1", "rl-evals-0"):
        lab.report(name, PodState.RUNNING)
    lab.now = 200.0
    fx = lab.report("rl-learner", PodState.SUCCEEDED, code=0)
    assert lab.job.stage == Stage.RUNNING  # the evaluator's last pass first
    assert sorted((k.pod_uid, k.reason) for k in fx.kills) == [
        ("j/rl-actors-0", "LeaderEnded"),
        ("j/rl-actors-1", "LeaderEnded"),
    ]
    assert lab.c.timer(lab.job.id) == 230.0
    lab.report("rl-actors-0", PodState.KILLED)
    assert lab.job.pods["rl-actors-0"].done and lab.state("rl-actors-0") == PodState.KILLED
    lab.now = 215.0
    lab.report("rl-evals-0", PodState.SUCCEEDED, code=0)  # done before its time ran out
    assert lab.job.stage == Stage.SUCCEEDED and lab.job.reason == "LeaderSucceeded"


def test_a_helper_still_running_past_its_delay_is_stopped_and_the_job_ends_as_the_leader_did() -> (
    None
):
    lab = Lab()
    lab.report("rl-evals-0", PodState.RUNNING)
    lab.now = 200.0
    lab.report("rl-learner", PodState.FAILED, code=1)  # restartLimit 1: it restarts first
    lab.now = 205.0
    lab.c.tick(lab.now)
    lab.report("rl-learner", PodState.RUNNING, rpc=7000)
    lab.report("rl-learner", PodState.FAILED, code=1)  # for good
    assert not lab.job.stage.finished and lab.job.pods["rl-learner"].done
    assert not lab.c.tick(234.9).kills
    fx = lab.c.tick(235.0)
    assert lab.job.stage == Stage.FAILED and lab.job.reason == "LeaderFailed"
    assert [k.pod_uid for k in fx.kills if k.reason == "JobFinished"] == ["j/rl-evals-0"]


def test_a_set_that_starts_after_the_leader_is_ready_waits_for_its_first_report() -> None:
    lab = Lab(extra="startAfter: leaderReady,")
    assert launched(lab.fx) == ["rl-actors-0", "rl-actors-1"]
    fx = lab.c.progress(lab.job, "rl-learner", lab.now)
    assert launched(fx) == ["rl-evals-0"]


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ("minWorkersNum: 2", "spec.minWorkersNum: must be between 0 and the total of counts (2;"),
        ("auxiliary: true,", "spec.workerSets[1].minCount: an auxiliary set is never in"),
        ("terminationDelaySeconds: 30,", "spec.workerSets[1].terminationDelaySeconds: is for an"),
        ("startAfter: soon,", "spec.workerSets[1].startAfter: 'soon' is not leaderReady"),
    ],
)
def test_helper_roles_are_checked_naming_the_field(change: str, error: str) -> None:
    text = {
        "minWorkersNum: 2": SPEC.replace("minWorkersNum: 2", "minWorkersNum: 3"),
        "auxiliary: true,": SPEC.replace("auxiliary: true,", "auxiliary: true, minCount: 1,"),
        "terminationDelaySeconds: 30,": SPEC.replace("auxiliary: true,", "auxiliary: false,"),
        "startAfter: soon,": SPEC.replace("EXTRA", "startAfter: soon,"),
    }[change].replace("EXTRA", "")
    with pytest.raises(SpecInvalid) as refused:
        parse_job(load_job_yaml(text))
    assert any(e.startswith(error) for e in refused.value.errors), refused.value.errors


def test_helper_roles_are_kept_in_the_stored_spec() -> None:
    spec = parse_job(load_job_yaml(SPEC.replace("EXTRA", "startAfter: leaderReady,")))
    evals = spec.worker_set("evals")
    assert evals is not None and evals.auxiliary and evals.termination_delay_s == 30
    assert evals.start_after == "leaderReady" and spec.wind_down_s == 30
    assert spec_from_json(spec_to_json(spec)) == spec
