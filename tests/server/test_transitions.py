"""The controller's story: each stimulus tagged with an id, each change of a job's stage and a
pod's state kept with it, in a bounded log, and written at debug level."""

from __future__ import annotations

import logging

import structlog
from structlog.testing import capture_logs

from arranger.client.specfile import load_job_yaml
from arranger.sched import JobDecision, Placement, Plan
from arranger.server.controller import Controller, ControllerConfig
from arranger.server.convert import spec_to_json
from arranger.server.model import JobRecord
from arranger.server.nodes import NodeRegistration, PodReport
from arranger.server.validation import parse_job
from arranger.states import PodState, ScheduleState

SPEC = """
metadata: {name: rl}
spec:
  leader: {name: learner, template: {command: [l]}}
  workerSets: [{name: actors, counts: 1, template: {command: [a]}}]
"""
LEADER, WORKER = "j/rl-learner", "j/rl-actors-0"


class Cluster:
    """Cluster: one node, n1, and job j (a learner and one actor), at time `now`."""

    def __init__(self, story_length: int = 1_000) -> None:
        self.c = Controller(ControllerConfig(story_length=story_length))
        self.now = 100.0
        self.c.node_registered(NodeRegistration("n1", "10.0.0.1", 8000, 2**33), self.now)
        spec = parse_job(load_job_yaml(SPEC))
        self.job: JobRecord = self.c.submit("j", spec, spec_to_json(spec), self.at(1))[0]

    def at(self, step: float) -> float:
        self.now += step
        return self.now

    def place(self) -> None:
        placements = [Placement("j", p.name, "n1") for p in self.job.pods.values()]
        decision = JobDecision("j", ScheduleState.SCHEDULED_SUCCEED)
        self.c.apply_plan(Plan(placements, {"j": decision}), self.at(1))

    def report(self, uid: str, state: PodState, **ports: int) -> None:
        pod = self.job.pods[uid.partition("/")[2]]
        exit_code = 0 if state == PodState.SUCCEEDED else None
        report = PodReport(uid, pod.attempt, state, pid=7, exit_code=exit_code, ports=ports)
        self.c.pod_reports("n1", [report], self.at(1))

    def run_to_the_end(self) -> None:
        self.place()
        self.report(LEADER, PodState.RUNNING, rpc=7000)
        self.report(WORKER, PodState.RUNNING)
        self.report(LEADER, PodState.SUCCEEDED)
        self.report(WORKER, PodState.KILLED)


def test_a_jobs_story_tells_it_was_submitted_placed_ran_and_finished() -> None:
    """Those of one stimulus come in the order of their keys: the job's first."""
    cluster = Cluster()
    cluster.run_to_the_end()
    told = [(t.stimulus_id, t.key, t.before, t.after, t.time) for t in cluster.c.story("j")]
    assert told == [
        ("submit-2", "j", "", "Pending", 101.0),
        ("submit-2", WORKER, "", "Pending", 101.0),
        ("submit-2", LEADER, "", "Pending", 101.0),
        ("apply-plan-3", "j", "Pending", "Starting", 102.0),
        ("apply-plan-3", WORKER, "Pending", "Placed", 102.0),  # waits for its leader to run
        ("apply-plan-3", LEADER, "Pending", "Launching", 102.0),  # placed and launched at once
        ("pod-reports-4", WORKER, "Placed", "Launching", 103.0),
        ("pod-reports-4", LEADER, "Launching", "Running", 103.0),
        ("pod-reports-5", "j", "Starting", "Running", 104.0),
        ("pod-reports-5", WORKER, "Launching", "Running", 104.0),
        ("pod-reports-6", "j", "Running", "Succeeded", 105.0),
        ("pod-reports-6", LEADER, "Running", "Succeeded", 105.0),
        ("pod-reports-7", WORKER, "Running", "Killed", 106.0),  # stopped as the job ended
    ]
    assert {t.stimulus for t in cluster.c.story("j")} == {"submit", "apply-plan", "pod-reports"}
    assert [t.after for t in cluster.c.story(WORKER)] == [
        "Pending",
        "Placed",
        "Launching",
        "Running",
        "Killed",
    ]


def test_the_story_is_bounded_and_keeps_the_newest() -> None:
    cluster = Cluster(story_length=4)
    cluster.run_to_the_end()
    assert [(t.stimulus_id, t.key, t.after) for t in cluster.c.transitions.recent()] == [
        ("pod-reports-5", WORKER, "Running"),
        ("pod-reports-6", "j", "Succeeded"),
        ("pod-reports-6", LEADER, "Succeeded"),
        ("pod-reports-7", WORKER, "Killed"),
    ]
    assert [t.after for t in cluster.c.story(LEADER)] == ["Succeeded"]


def test_a_stimulus_that_changes_no_stage_or_state_tells_nothing() -> None:
    cluster = Cluster()
    cluster.place()
    told = len(cluster.c.transitions.recent())
    cluster.c.heartbeat("n1", 10.0, 2**30, cluster.at(1))
    cluster.place()  # the same plan again: nothing is Pending any more
    assert len(cluster.c.transitions.recent()) == told


def test_records_put_back_are_known_as_they_are_without_a_transition() -> None:
    cluster = Cluster()
    cluster.place()
    cluster.report(LEADER, PodState.RUNNING, rpc=7000)
    restarted = Controller()
    restarted.restore([cluster.job], list(cluster.c.nodes.values()), cluster.at(1))
    assert restarted.story("j") == []
    report = PodReport(LEADER, cluster.job.leader.attempt, PodState.FAILED, exit_code=3)
    restarted.node_registered(
        NodeRegistration("n1", "10.0.0.1", 8000, 2**33, pods=(report,)), cluster.at(1)
    )
    assert [(t.key, t.before, t.after) for t in restarted.story(LEADER)] == [
        (LEADER, "Running", "Placed")  # it failed, and runs again in place after back-off
    ]


def test_each_transition_is_logged_at_debug_level() -> None:
    before = structlog.get_config()["wrapper_class"]
    try:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
        with capture_logs() as logs:
            cluster = Cluster()
        assert logs == [] and len(cluster.c.story("j")) == 3  # kept, not written at info
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
        with capture_logs() as logs:
            cluster.place()
    finally:
        structlog.configure(wrapper_class=before)
    assert logs == [
        {
            "event": "transition",
            "log_level": "debug",
            "stimulus_id": "apply-plan-3",
            "key": key,
            "before": was,
            "after": now,
        }
        for key, was, now in [
            ("j", "Pending", "Starting"),
            (WORKER, "Pending", "Placed"),
            (LEADER, "Pending", "Launching"),
        ]
    ]
