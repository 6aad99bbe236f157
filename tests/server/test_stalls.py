"""Stalls: a pod that reported progress and then none for its role's progressTimeoutSeconds is
Stalled; onStall says what follows (notify, restart counting a restart, fail the job). The
controller as a pure state machine, time injected."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import grpc
import pytest

from arranger.client.sdk import AsyncClient
from arranger.client.specfile import load_job_yaml
from arranger.sched import JobDecision, Placement, Plan
from arranger.server.controller import Controller, ControllerConfig
from arranger.server.convert import job_progress, job_to_proto, spec_from_json, spec_to_json
from arranger.server.dashboard_pages import job_row
from arranger.server.effects import Effects
from arranger.server.limits import UserLimits
from arranger.server.nodes import NodeRegistration, PodReport
from arranger.server.validation import SpecInvalid, parse_job
from arranger.states import PodState, ScheduleState, Stage
from arranger.v1 import arranger_pb2
from tests.conftest import bare_server, job_spec
from tests.server.test_experiments import WAITS
from tests.server.test_report_limits import LIMIT

SPEC = """
metadata: {name: rl}
spec:
  restartLimit: 2
  minWorkersNum: 2
  leader: {name: learner, progressTimeoutSeconds: 30, onStall: LEADER, template: {command: [l]}}
  workerSets:
  - {name: actors, counts: 2, progressTimeoutSeconds: 10, onStall: ACTORS, template: {command: [a]}}
"""


class Lab:
    """Lab: the job above on node n1 with every pod running, its onStall as given."""

    def __init__(self, leader: str = "notify", actors: str = "notify") -> None:
        self.c = Controller(ControllerConfig(backoff_initial_s=1.0, backoff_max_s=8.0))
        self.now = 100.0
        self.c.node_registered(NodeRegistration("n1", "10.0.0.1", 8000, 2**33), self.now)
        spec = parse_job(load_job_yaml(SPEC.replace("LEADER", leader).replace("ACTORS", actors)))
        self.job, _ = self.c.submit("j", spec, spec_to_json(spec), self.now)
        placements = [Placement("j", name, "n1") for name in self.job.pods]
        decision = {"j": JobDecision("j", ScheduleState.SCHEDULED_SUCCEED)}
        self.c.apply_plan(Plan(placements, decision), self.now)
        for name in self.job.pods:
            self.report(name, PodState.RUNNING, rpc=7000)
        assert self.job.stage == Stage.RUNNING

    def report(self, name: str, state: PodState, **ports: int) -> Effects:
        pod = self.job.pods[name]
        report = PodReport(pod.uid, pod.attempt, state, pid=10, ports=ports)
        return self.c.pod_reports("n1", [report], self.now)

    def progress(self, *names: str) -> Effects:
        fx = Effects()
        for name in names:
            fx.merge(self.c.progress(self.job, name, self.now))
        return fx

    def at(self, now: float) -> Effects:
        self.now = now
        return self.c.tick(now)


def kinds(fx: Effects) -> list[str]:
    return [e.kind for e in fx.events]


def test_a_pod_that_never_reported_is_never_stalled_and_one_that_stopped_is() -> None:
    lab = Lab()
    assert lab.c.timer(lab.job.id) is None and not kinds(lab.at(1000.0))
    lab.progress("rl-learner")
    assert not lab.progress("rl-learner")  # progress alone writes nothing
    assert lab.c.timer(lab.job.id) == 1030.0
    assert not kinds(lab.at(1029.0))
    fx = lab.at(1030.0)
    (stalled,) = fx.events
    assert stalled.kind == "Stalled" and stalled.pod == "rl-learner"
    assert "reported no progress for 30s (progressTimeoutSeconds 30; onStall: notify)" in (
        stalled.message
    )
    learner = lab.job.pods["rl-learner"]
    assert learner.reason == "Stalled" and lab.job.stage == Stage.RUNNING  # notify: no more
    status = job_to_proto(lab.job).status
    assert status.leader.stalled and status.leader.reason == "Stalled"
    assert job_progress(lab.job).message.endswith("; stalled: rl-learner")
    assert job_row(lab.job).message.endswith("; stalled: rl-learner")  # the dashboard's
    assert not kinds(lab.at(2000.0))  # told once
    assert kinds(lab.progress("rl-learner")) == ["Progressing"]
    assert learner.reason == "" and not job_to_proto(lab.job).status.leader.stalled
    assert lab.c.timer(lab.job.id) == 2030.0


def test_of_a_gang_the_pod_that_stopped_first_is_named_first() -> None:
    lab = Lab()
    lab.now = 100.0
    lab.progress("rl-actors-0", "rl-actors-1")
    lab.now = 103.0
    lab.progress("rl-actors-0")  # actors-1 stopped at 100, actors-0 at 103: a hung collective
    fx = lab.at(120.0)
    assert [(e.kind, e.pod) for e in fx.events] == [
        ("Stalled", "rl-actors-1"),
        ("Stalled", "rl-actors-0"),
    ]
    assert "it stopped first of 2" in fx.events[0].message
    assert fx.events[1].message.endswith("; rl-actors-1 stopped first")


def test_a_pod_found_stalled_later_names_the_one_that_stopped_first() -> None:
    lab = Lab()
    lab.progress("rl-actors-1")
    lab.now = 104.0
    lab.progress("rl-actors-0")
    (first,) = lab.at(110.0).events  # actors-1 alone, found at its own deadline
    assert first.pod == "rl-actors-1" and "stopped first" not in first.message
    (later,) = lab.at(114.0).events
    assert later.pod == "rl-actors-0" and later.message.endswith("; rl-actors-1 stopped first")


def test_on_stall_restart_stops_the_pod_and_its_end_spends_a_restart() -> None:
    lab = Lab(actors="restart")
    lab.progress("rl-actors-0")
    fx = lab.at(110.0)
    assert [(k.pod_uid, k.reason) for k in fx.kills] == [("j/rl-actors-0", "Stalled")]
    fx = lab.report("rl-actors-0", PodState.KILLED)  # the agent reports the stop as Killed
    actor = lab.job.pods["rl-actors-0"]
    assert "Restarting" in kinds(fx) and lab.job.set_restarts == {"actors": 1}
    assert actor.state == PodState.PLACED and actor.attempt == 1 and actor.progress_at is None
    lab.at(actor.not_before)
    lab.report("rl-actors-0", PodState.RUNNING)
    assert not kinds(lab.at(10_000.0))  # the new attempt is watched from its first report


def test_on_stall_fail_fails_the_job() -> None:
    lab = Lab(leader="fail")
    lab.progress("rl-learner")
    lab.at(130.0)
    assert lab.job.stage == Stage.FAILED and lab.job.reason == "Stalled"
    assert lab.job.message == "rl-learner reported no progress (onStall: fail)"


@pytest.mark.parametrize(
    ("policy", "error"),
    [
        ("progressTimeoutSeconds: 30, onStall: later", "onStall: 'later' is not one of"),
        ("onStall: fail", "onStall: needs progressTimeoutSeconds"),
        ("progressTimeoutSeconds: 0", "progressTimeoutSeconds: must be above 0"),
    ],
)
def test_a_stall_policy_is_checked_naming_the_field(policy: str, error: str) -> None:
    text = SPEC.replace("progressTimeoutSeconds: 30, onStall: LEADER", policy).replace(
        "ACTORS", "notify"
    )
    with pytest.raises(SpecInvalid) as refused:
        parse_job(load_job_yaml(text))
    assert any(e.startswith("spec.leader." + error) for e in refused.value.errors), refused


def test_a_stall_policy_is_kept_in_the_stored_spec() -> None:
    spec = parse_job(load_job_yaml(SPEC.replace("LEADER", "fail").replace("ACTORS", "restart")))
    assert spec.stall_of("").timeout_s == 30 and spec.stall_of("").on_stall == "fail"
    assert spec.stall_of("actors").on_stall == "restart"
    assert spec_from_json(spec_to_json(spec)) == spec


def test_a_stalled_pod_stopped_to_restart_but_lost_with_its_node_spends_no_restart() -> None:
    """A node cut off from the network: its pods' reports stop (Stalled; the kill ordered for
    onStall: restart cannot arrive), then the node is lost. The pod ends Lost, which spends no
    restart, not Failed for its stall."""
    lab = Lab(actors="restart")
    lab.progress("rl-actors-0")
    assert [k.reason for k in lab.at(110.0).kills] == ["Stalled"]
    lab.now = 10_000.0
    lab.c.check_nodes(lab.now)
    actor = lab.job.pods["rl-actors-0"]
    assert lab.job.set_restarts == {} and actor.state != PodState.FAILED


async def test_a_refused_report_is_still_progress(tmp_path: Path) -> None:
    """A report whose values the server refuses to keep (the owner's jobBytesPerUser is full)
    still says its pod is alive: the pod is not found Stalled for it."""
    config = dataclasses.replace(WAITS, limits=UserLimits(job_bytes_per_user=LIMIT))
    async with (
        bare_server(tmp_path, config) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        doc = job_spec("live", ["true"], workers=0, minWorkersNum=0)
        doc["spec"]["workerSets"] = []
        doc["spec"]["leader"].update(progressTimeoutSeconds=600, onStall="fail")
        await client.submit(doc, queue_anyway=True)
        (job,) = [j for j in server.controller.jobs.values() if j.name == "live"]
        job.leader.state = PodState.RUNNING  # no agent here: as if its learner ran
        stub = client._stubs[0]
        await stub.ReportValues(one_point("live", "live-learner", 1))
        first = job.leader.progress_at
        assert first is not None
        gate = server.submits
        gate.limits = dataclasses.replace(gate.limits, job_bytes_per_user=sum(gate._bytes.values()))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ReportValues(one_point("live", "live-learner", 2))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert job.leader.progress_at is not None and job.leader.progress_at > first


def one_point(job: str, pod: str, step: int) -> arranger_pb2.ReportValuesRequest:
    point = arranger_pb2.ReportPoint(step=step, values={"loss": 0.5})
    return arranger_pb2.ReportValuesRequest(job=job, points=[point], pod=pod)
