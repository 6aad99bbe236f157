"""Transient failures: an exit code a spec lists in retryOnExitCodes restarts its pod without
spending restartLimit, with back-off and a cap of its own (transientRetryLimit); past the cap,
restartLimit decides. The controller as a pure state machine, time injected."""

from __future__ import annotations

from pathlib import Path

import pytest

from arranger.client.specfile import load_job_yaml
from arranger.sched import JobDecision, Placement, Plan
from arranger.server.config import load_server_config
from arranger.server.controller import Controller, ControllerConfig
from arranger.server.convert import job_to_proto, spec_from_json, spec_to_json
from arranger.server.nodes import NodeRegistration, PodReport
from arranger.server.validation import SpecInvalid, parse_job
from arranger.states import PodState, ScheduleState, Stage

SPEC = """
metadata: {name: rl}
spec:
  restartLimit: 1
  leader: {name: learner, retryOnExitCodes: [75, 134], template: {command: [l]}}
  workerSets:
  - {name: actors, counts: 2, retryOnExitCodes: [75], template: {command: [a]}}
  - {name: evals, counts: 1, template: {command: [e]}}
"""


class Lab:
    """Lab: the job above on node n1, every pod running; `fail` ends one with a code."""

    def __init__(self, retry_limit: int = 2) -> None:
        self.c = Controller(
            ControllerConfig(
                backoff_initial_s=1.0, backoff_max_s=8.0, transient_retry_limit=retry_limit
            )
        )
        self.now = 100.0
        self.c.node_registered(NodeRegistration("n1", "10.0.0.1", 8000, 2**33), self.now)
        spec = parse_job(load_job_yaml(SPEC))
        self.job, _ = self.c.submit("j", spec, spec_to_json(spec), self.now)
        placements = [Placement("j", name, "n1") for name in self.job.pods]
        decision = {"j": JobDecision("j", ScheduleState.SCHEDULED_SUCCEED)}
        self.c.apply_plan(Plan(placements, decision), self.now)
        self.run("rl-learner", rpc=7000)
        for name in ("rl-actors-0", "rl-actors-1", "rl-evals-0"):
            self.run(name)

    def run(self, name: str, **ports: int) -> None:
        pod = self.job.pods[name]
        report = PodReport(pod.uid, pod.attempt, PodState.RUNNING, pid=10, ports=ports)
        self.c.pod_reports("n1", [report], self.now)

    def fail(self, name: str, code: int) -> list[str]:
        """fail ends the pod's attempt with `code` and brings it back once its back-off has
        passed; returns the kinds of the events that came of it."""
        pod = self.job.pods[name]
        report = PodReport(pod.uid, pod.attempt, PodState.FAILED, pid=10, exit_code=code)
        fx = self.c.pod_reports("n1", [report], self.now)
        kinds = [e.kind for e in fx.events]
        if pod.state == PodState.PLACED:
            self.now = max(self.now, pod.not_before)
            self.c.tick(self.now)
            self.run(name, **({"rpc": 7000} if name == "rl-learner" else {}))
        return kinds


def test_a_listed_exit_code_restarts_with_back_off_and_spends_no_restart() -> None:
    lab = Lab(retry_limit=2)
    learner = lab.job.pods["rl-learner"]
    assert "Retrying" in lab.fail("rl-learner", 75)
    assert lab.job.retries == {"": 1} and lab.job.leader_restarts == 0
    assert learner.attempt == 1 and learner.state == PodState.RUNNING
    before = lab.now
    lab.fail("rl-learner", 134)
    assert lab.job.retries == {"": 2} and learner.not_before == before + 2.0  # back-off doubles
    # Past transientRetryLimit: restartLimit decides (1), then the job fails.
    assert lab.fail("rl-learner", 75)[:2] == ["RetriesSpent", "Restarting"]
    assert lab.job.leader_restarts == 1 and lab.job.stage == Stage.RUNNING
    lab.fail("rl-learner", 75)
    assert lab.job.stage == Stage.FAILED and lab.job.reason == "LeaderFailed"


def test_an_unlisted_code_spends_a_restart_and_each_set_keeps_its_own_retries() -> None:
    lab = Lab(retry_limit=3)
    assert "Restarting" in lab.fail("rl-learner", 1)
    assert lab.job.leader_restarts == 1 and lab.job.retries == {}
    assert "Retrying" in lab.fail("rl-actors-0", 75)
    assert "Retrying" in lab.fail("rl-actors-1", 75)
    assert lab.job.retries == {"actors": 2} and lab.job.set_restarts == {}
    assert "Restarting" in lab.fail("rl-evals-0", 75)  # not in the evals' list
    assert lab.job.set_restarts == {"evals": 1}
    status = job_to_proto(lab.job).status
    assert status.leader_retries == 0 and dict(status.worker_set_retries) == {"actors": 2}


def test_retry_codes_are_checked_and_kept_in_the_stored_spec() -> None:
    spec = parse_job(load_job_yaml(SPEC))
    assert spec.leader_retry_on_exit_codes == (75, 134)
    assert spec.retry_codes("actors") == (75,) and spec.retry_codes("evals") == ()
    assert spec_from_json(spec_to_json(spec)) == spec
    for codes, why in (("[0]", "0 is not an exit code"), ("[256]", "256 is not an exit code")):
        bad = SPEC.replace("retryOnExitCodes: [75, 134]", f"retryOnExitCodes: {codes}")
        with pytest.raises(SpecInvalid) as refused:
            parse_job(load_job_yaml(bad))
        assert any(
            e.startswith("spec.leader.retryOnExitCodes: " + why) for e in refused.value.errors
        )
    many = SPEC.replace("retryOnExitCodes: [75]", f"retryOnExitCodes: {list(range(1, 40))}")
    with pytest.raises(SpecInvalid) as refused:
        parse_job(load_job_yaml(many))
    assert (
        "spec.workerSets[0].retryOnExitCodes: must have at most 32 entries" in refused.value.errors
    )


def test_the_retry_limit_is_a_server_setting(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text("insecure: true\ntransientRetryLimit: 9\n")
    assert load_server_config(path).controller.transient_retry_limit == 9
    assert load_server_config(None, insecure=True).controller.transient_retry_limit == 5
    path.write_text("insecure: true\ntransientRetryLimit: -1\n")
    with pytest.raises(ValueError, match="transientRetryLimit"):
        load_server_config(path)


def test_a_pod_lost_again_and_again_backs_off_and_then_spends_its_restarts() -> None:
    """A pod lost with its node (or its agent) spends no restart, but each loss is a transient
    retry: from the second on it backs off, and past transientRetryLimit restartLimit decides,
    so a pod that takes its node down each time it runs is not run again forever."""
    lab = Lab(retry_limit=3)
    learner = lab.job.pods["rl-learner"]
    waits = []
    for _ in range(3):
        report = PodReport(learner.uid, learner.attempt, PodState.LOST, reason="AgentLostIt")
        kinds = [e.kind for e in lab.c.pod_reports("n1", [report], lab.now).events]
        assert "Requeued" in kinds and lab.job.leader_restarts == 0
        waits.append(learner.not_before - lab.now)
        lab.now = max(lab.now, learner.not_before)
        lab.c.tick(lab.now)
        lab.run("rl-learner", rpc=7000)
    assert waits == [0.0, 1.0, 2.0] and lab.job.retries == {"": 3}
    report = PodReport(learner.uid, learner.attempt, PodState.LOST, reason="AgentLostIt")
    kinds = [e.kind for e in lab.c.pod_reports("n1", [report], lab.now).events]
    assert kinds[:2] == ["RetriesSpent", "Restarting"] and lab.job.leader_restarts == 1
