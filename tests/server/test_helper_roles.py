"""Helper roles: an auxiliary worker set (an evaluator, a replay buffer) is placed with the job
but never in its gang minimum nor minWorkersNum, never fails the job, runs on for its
terminationDelaySeconds once the leader has ended, and may wait for the leader's first report
(startAfter: leaderReady). The controller as a pure state machine, time injected."""

from __future__ import annotations

import pytest

from arranger.client.specfile import load_job_yaml
from arranger.sched import JobDecision, Placement, Plan, run_cycle
from arranger.server.controller import Controller, ControllerConfig
from arranger.server.convert import spec_from_json, spec_to_json
from arranger.server.effects import Effects
from arranger.server.nodes import NodeRegistration, PodReport
from arranger.server.scaling import scale_problem
from arranger.server.snapshot import build_snapshot
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

    def __init__(self, extra: str = "", text: str = SPEC) -> None:
        self.c = Controller(ControllerConfig(backoff_initial_s=1.0, backoff_max_s=8.0))
        self.now = 100.0
        self.c.node_registered(NodeRegistration("n1", "10.0.0.1", 8000, 2**33), self.now)
        spec = parse_job(load_job_yaml(text.replace("EXTRA", extra)))
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


WINDS = """
metadata: {name: rl}
spec:
  restartLimit: 0
  minWorkersNum: 1
  cleanPodPolicy: POLICY
  EXTRA
  leader: {name: learner, template: {command: [l]}}
  workerSets:
  - {name: actors, counts: 1, template: {command: [a]}}
  - {name: evals, counts: 1, auxiliary: true, terminationDelaySeconds: 600, AUX template: {command: [e]}}
  - {name: buffer, counts: 1, auxiliary: true, terminationDelaySeconds: 3600, template: {command: [b]}}
"""


class Winding(Lab):
    """Winding: the job above with every pod running (as Lab, for another spec)."""

    def __init__(self, policy: str = "All", extra: str = "", aux: str = "") -> None:
        super().__init__(extra, WINDS.replace("POLICY", policy).replace("AUX", aux))
        for name in ("rl-actors-0", "rl-evals-0", "rl-buffer-0"):
            self.report(name, PodState.RUNNING)
        assert self.job.stage == Stage.RUNNING


def test_what_falls_due_while_the_helpers_finish_leaves_the_leaders_outcome() -> None:
    """Once the leader has ended, the job ends as it decided: its maxRuntimeSeconds passing,
    a helper's stall with onStall: fail, or a stop (which only cuts the wait short) do not
    change that."""
    lab = Winding(extra="maxRuntimeSeconds: 1000", aux="progressTimeoutSeconds: 60, onStall: fail,")
    lab.c.progress(lab.job, "rl-evals-0", 150.0)
    lab.now = 1000.0
    lab.report("rl-learner", PodState.SUCCEEDED, code=0)
    lab.c.tick(1100.0)  # past maxRuntimeSeconds, and the evaluator quiet past its timeout
    assert not lab.job.stage.finished and lab.job.pods["rl-evals-0"].reason != "Stalled"
    lab.c.stop(lab.job, 1200.0, "alice")
    assert (lab.job.stage, lab.job.reason) == (Stage.SUCCEEDED, "LeaderSucceeded")

    failed = Winding()
    failed.now = 200.0
    failed.report("rl-learner", PodState.FAILED, code=3)  # restartLimit 0: for good
    failed.c.stop(failed.job, 210.0, "alice")
    assert (failed.job.stage, failed.job.reason) == (Stage.FAILED, "LeaderFailed")


@pytest.mark.parametrize("policy", ["None", "Running"])
def test_once_a_short_delay_ran_out_the_timer_is_the_next_and_a_tick_writes_nothing(
    policy: str,
) -> None:
    """Two helper sets with different delays: once the shorter has run out (its worker
    stopped, or left to finish by cleanPodPolicy None), the job's timer is the longer one,
    not a time past that would tick it, and rewrite that worker, every period."""
    lab = Winding(policy)
    lab.now = 200.0
    lab.report("rl-learner", PodState.SUCCEEDED, code=0)
    lab.c.tick(800.0)  # the evaluator's 600 s have run out
    assert not lab.job.stage.finished
    assert lab.c.timer(lab.job.id) == 3800.0
    fx = lab.c.tick(801.0)
    assert not fx.pods and not fx.jobs and not fx.kills


def test_scaling_a_counted_set_below_min_workers_is_refused_but_a_helper_set_may_go_to_zero() -> (
    None
):
    """minWorkersNum counts the sets that are not auxiliary: a scale that would leave fewer
    is refused (it would fail the job at once); a helper set may be scaled as its range says."""
    text = SPEC.replace("counts: 2,", "counts: 2, maxCounts: 4,").replace("EXTRA", "")
    c = Controller(ControllerConfig())
    c.node_registered(NodeRegistration("n1", "10.0.0.1", 8000, 2**33), 0.0)
    spec = parse_job(
        load_job_yaml(text.replace("counts: 1, auxiliary", "counts: 1, maxCounts: 2, auxiliary"))
    )
    job, _ = c.submit("j", spec, spec_to_json(spec), 0.0)
    problem = scale_problem(job, "actors", 1)
    assert problem is not None and "fewer than its minWorkersNum (2)" in problem[1]
    assert scale_problem(job, "evals", 0) is None


def test_a_gang_jobs_helper_is_outside_its_minimum_and_need_not_fit() -> None:
    """basicPolicy Gang places every pod but a helper's together: a Gang job whose evaluator
    needs a GPU no node has starts without it."""
    text = """
metadata: {name: rl}
spec:
  schedulerPolicy: {basicPolicy: Gang}
  leader: {name: learner, template: {command: [l]}}
  workerSets:
  - {name: actors, counts: 2, template: {command: [a]}}
  - {name: evals, counts: 1, auxiliary: true, template: {command: [e], resources: {gpu: 1}}}
"""
    c = Controller(ControllerConfig())
    c.node_registered(NodeRegistration("n1", "10.0.0.1", 8000, 2**34), 0.0)  # no GPU
    spec = parse_job(load_job_yaml(text))
    job, _ = c.submit("j", spec, spec_to_json(spec), 0.0)
    assert not job.pods["rl-evals-0"].in_minimum and job.pods["rl-actors-1"].in_minimum
    plan = run_cycle(build_snapshot(c, 1.0))
    assert sorted(p.pod for p in plan.placements) == ["rl-actors-0", "rl-actors-1", "rl-learner"]
