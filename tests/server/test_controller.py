"""The controller as a pure state machine: stimuli in, effects out, no I/O, time injected."""

from __future__ import annotations

import dataclasses

import pytest

from arranger.client.specfile import load_job_yaml
from arranger.sched import GpuShare, JobDecision, Placement, Plan
from arranger.sched.plan import Eviction
from arranger.server.controller import Controller, ControllerConfig
from arranger.server.convert import spec_to_json
from arranger.server.effects import Effects
from arranger.server.model import PodRecord
from arranger.server.nodes import NodeRegistration, PodReport
from arranger.server.validation import parse_job
from arranger.states import PodState, ScheduleState, Stage

SPEC = """
metadata: {{name: rl}}
spec:
  restartLimit: 2
  minWorkersNum: 2
  cleanPodPolicy: {policy}
  leader: {{name: learner, template: {{command: [l]}}}}
  workerSets: [{{name: actors, counts: 3, template: {{command: [a]}}}}]
"""


class Harness:
    """Harness drives one job on nodes n1 and n2 and remembers the last effects."""

    def __init__(self, policy: str = "All") -> None:
        self.c = Controller(
            ControllerConfig(backoff_initial_s=1.0, backoff_max_s=8.0, node_timeout_s=30.0)
        )
        self.now = 100.0
        for name in ("n1", "n2"):
            self.c.node_registered(
                NodeRegistration(name, f"10.0.0.{name[1]}", 8000, 2**33), self.now
            )
        spec = parse_job(load_job_yaml(SPEC.format(policy=policy)))
        self.job, self.fx = self.c.submit("j", spec, spec_to_json(spec), self.now)

    def pod(self, name: str) -> PodRecord:
        return self.job.pods[f"rl-{name}"]

    def place(self, **where: str) -> Effects:
        placements = [Placement("j", f"rl-{pod}", node) for pod, node in where.items()]
        left = [
            p
            for p in self.job.pods.values()
            if p.state == PodState.PENDING and p.name[3:] not in where
        ]
        state = ScheduleState.SCHEDULED_PARTLY if left else ScheduleState.SCHEDULED_SUCCEED
        self.fx = self.c.apply_plan(Plan(placements, {"j": JobDecision("j", state)}), self.now)
        return self.fx

    def report(
        self, name: str, state: PodState, exit_code: int | None = None, why: str = "", **ports: int
    ) -> Effects:
        pod = self.pod(name)
        report = PodReport(
            pod.uid, pod.attempt, state, pid=1000, exit_code=exit_code, reason=why, ports=ports
        )
        self.fx = self.c.pod_reports(pod.node, [report], self.now)
        return self.fx

    def start_all(self) -> None:
        self.place(learner="n1", **{"actors-0": "n1", "actors-1": "n2", "actors-2": "n2"})
        self.report("learner", PodState.RUNNING, rpc=7000)
        for i in range(3):
            self.report(f"actors-{i}", PodState.RUNNING)


def launched(fx: Effects) -> list[str]:
    return [o.pod_uid.split("/")[1] for o in fx.launches]


def test_a_job_starts_leader_first_then_workers_with_its_address() -> None:
    h = Harness()
    assert h.job.stage == Stage.PENDING and h.fx.schedule
    fx = h.place(learner="n1", **{"actors-0": "n1", "actors-1": "n2", "actors-2": "n2"})
    assert h.job.stage == Stage.STARTING and launched(fx) == ["rl-learner"]
    leader_order = fx.launches[0]
    assert leader_order.leader_port_name == "rpc" and leader_order.ports == {"rpc": 0}
    fx = h.report("learner", PodState.RUNNING, rpc=7000)
    assert h.job.leader_address == "10.0.0.1:7000"
    assert launched(fx) == ["rl-actors-0", "rl-actors-1", "rl-actors-2"]
    env = fx.launches[2].env
    assert env["ARRANGER_LEADER_ADDR"] == "10.0.0.1:7000" and env["ARRANGER_WORKER_RANK"] == "2"
    assert env["ARRANGER_NUM_WORKERS"] == "3" and env["ARRANGER_WORKER_SET"] == "actors"
    h.report("actors-0", PodState.RUNNING)
    assert h.job.stage == Stage.STARTING  # one of minWorkersNum 2
    h.report("actors-1", PodState.RUNNING)
    assert h.job.stage == Stage.RUNNING


def test_a_failed_leader_restarts_in_place_after_back_off_keeping_its_port() -> None:
    h = Harness()
    h.start_all()
    fx = h.report("learner", PodState.FAILED, exit_code=1)
    leader = h.pod("learner")
    assert leader.state == PodState.PLACED and leader.attempt == 1 and leader.node == "n1"
    assert leader.not_before == h.now + 1.0 and not fx.launches
    assert h.c.timer(h.job.id) == h.now + 1.0
    assert not h.c.tick(h.now + 0.5).launches
    fx = h.c.tick(h.now + 1.0)
    assert launched(fx) == ["rl-learner"] and fx.launches[0].ports == {"rpc": 7000}
    assert fx.launches[0].env["ARRANGER_RESTART_COUNT"] == "1"
    assert h.job.stage == Stage.RUNNING and h.job.leader_restarts == 1


def test_back_off_doubles_and_the_job_fails_past_restart_limit() -> None:
    h = Harness()
    h.start_all()
    for restart in (1, 2):
        h.report("learner", PodState.FAILED, exit_code=1)
        assert h.pod("learner").not_before == h.now + 2 ** (restart - 1)
        h.now += 10
        h.c.tick(h.now)
        h.report("learner", PodState.RUNNING, rpc=7000)
    fx = h.report("learner", PodState.FAILED, exit_code=3)
    assert h.job.stage == Stage.FAILED and h.job.reason == "LeaderFailed"
    assert "exit code 3 after 2 restarts (restartLimit 2)" in h.job.message
    assert sorted(k.pod_uid for k in fx.kills if k.grace_s > 0) == [
        f"j/rl-actors-{i}" for i in range(3)
    ]
    assert all(k.remove_scratch for k in fx.kills)


def test_workers_restart_per_set_budget_and_too_few_fail_the_job() -> None:
    h = Harness()
    h.start_all()
    h.report("actors-0", PodState.FAILED, exit_code=1)
    h.report("actors-1", PodState.FAILED, exit_code=1)
    assert h.job.set_restarts == {"actors": 2} and h.job.stage == Stage.RUNNING
    h.now += 10
    h.c.tick(h.now)
    h.report("actors-0", PodState.RUNNING)
    h.report("actors-0", PodState.FAILED, exit_code=1)  # budget spent: actors-0 is done
    assert h.pod("actors-0").done and h.job.stage == Stage.RUNNING  # 2 of 3 still there
    h.report("actors-2", PodState.FAILED, exit_code=1)
    assert h.job.stage == Stage.FAILED and h.job.reason == "TooFewWorkers"


NOT_FOUND = "CommandNotFound: cannot start `l`: No such file or directory (not found in PATH=/bin)"


def test_a_leader_that_cannot_start_fails_the_job_at_once_naming_pod_and_command() -> None:
    h = Harness()
    h.start_all()
    fx = h.report("learner", PodState.FAILED, exit_code=127, why=NOT_FOUND)
    assert (h.job.stage, h.job.reason) == (Stage.FAILED, "CommandNotFound")
    assert h.job.message == (
        "rl-learner: cannot start `l`: No such file or directory (not found in PATH=/bin)"
    )
    assert h.job.leader_restarts == 0 and not fx.launches and h.pod("learner").attempt == 0
    assert len([k for k in fx.kills if k.grace_s > 0]) == 3
    h = Harness()
    h.start_all()
    why = "CommandNotExecutable: cannot start `l`: Permission denied"
    h.report("learner", PodState.FAILED, exit_code=126, why=why)
    assert (h.job.stage, h.job.reason) == (Stage.FAILED, "CommandNotExecutable")


def test_a_worker_that_cannot_start_spends_its_set_at_once() -> None:
    h = Harness()  # restartLimit 2, minWorkersNum 2 of 3
    h.start_all()
    why = NOT_FOUND.replace("`l`", "`a`")
    fx = h.report("actors-1", PodState.FAILED, exit_code=127, why=why)
    assert h.pod("actors-1").done and h.pod("actors-1").attempt == 0 and not fx.launches
    assert h.job.set_restarts == {"actors": 2} and h.job.stage == Stage.RUNNING
    assert any(e.kind == "WorkerFailed" and "cannot start `a`" in e.message for e in fx.events)
    h.report("actors-2", PodState.FAILED, exit_code=1)  # no restart left in the set
    assert h.pod("actors-2").done and h.job.stage == Stage.FAILED
    assert h.job.reason == "TooFewWorkers"
    assert h.job.message.endswith("; rl-actors-1: " + why.partition(": ")[2])


def test_a_start_error_that_may_pass_restarts_as_a_failure_does() -> None:
    h = Harness()
    h.start_all()
    why = "StartError: cannot start `l`: cannot enter working directory /x: No such file"
    h.report("learner", PodState.FAILED, exit_code=127, why=why)
    assert h.job.leader_restarts == 1 and h.job.stage == Stage.RUNNING
    assert h.pod("learner").state == PodState.PLACED


def test_a_worker_that_exits_zero_is_done_and_not_restarted() -> None:
    h = Harness()
    h.start_all()
    fx = h.report("actors-2", PodState.SUCCEEDED, exit_code=0)
    assert h.pod("actors-2").done and not fx.launches and h.job.set_restarts == {}
    assert h.job.stage == Stage.RUNNING


def test_leader_exit_zero_succeeds_the_job_and_policy_running_keeps_scratch() -> None:
    h = Harness(policy="Running")
    h.start_all()
    fx = h.report("learner", PodState.SUCCEEDED, exit_code=0)
    assert h.job.stage == Stage.SUCCEEDED and h.job.reason == "LeaderSucceeded"
    assert len(fx.kills) == 3 and not any(k.remove_scratch for k in fx.kills)


def test_policy_none_leaves_processes_running() -> None:
    h = Harness(policy="None")
    h.start_all()
    fx = h.report("learner", PodState.SUCCEEDED, exit_code=0)
    assert h.job.stage == Stage.SUCCEEDED and not fx.kills
    assert all(h.pod(f"actors-{i}").state == PodState.RUNNING for i in range(3))


def test_stop_in_pending_succeeds_without_launching() -> None:
    h = Harness()
    fx = h.c.stop(h.job, h.now)
    assert h.job.stage == Stage.SUCCEEDED and h.job.reason == "Stopped" and not fx.launches
    assert all(p.state == PodState.KILLED for p in h.job.pods.values())


def test_a_lost_leader_node_reschedules_the_job_and_counts_no_restart() -> None:
    """Pods lost with their node failed in nothing of their own: they run again elsewhere
    with no restart counted and no back-off (as Slurm requeues on node failure)."""
    h = Harness()
    h.start_all()
    h.now += 31
    h.c.heartbeat("n2", 0, 0, h.now)  # n1 stays silent
    fx = h.c.check_nodes(h.now)
    assert h.job.stage == Stage.RESCHEDULING and h.job.leader_restarts == 0
    leader = h.pod("learner")
    assert leader.state == PodState.PENDING and leader.node == "" and leader.ports == {}
    assert h.pod("actors-0").state == PodState.PENDING  # it was on n1 too: lost, to be placed again
    requeued = [e.message for e in fx.events if e.kind == "Requeued"]
    assert "rl-learner lost (NodeLost); it runs again, no restart spent (retry 1 of 5)" in requeued
    assert h.job.retries == {"": 1, "actors": 1}  # a transient retry each (transientRetryLimit)
    killed = {k.pod_uid for k in fx.kills}
    assert killed == {
        "j/rl-actors-1",
        "j/rl-actors-2",
    }  # workers on n2 restart with the new address
    for name in ("actors-1", "actors-2"):
        h.report(name, PodState.KILLED, exit_code=143)
        pod = h.pod(name)
        assert pod.state == PodState.PLACED and pod.attempt == 1 and pod.node == "n2"
    assert h.job.set_restarts == {}  # lost or requeued: every restart budget is whole
    fx = h.place(learner="n2", **{"actors-0": "n2"})
    assert launched(fx) == ["rl-learner"] and h.job.stage == Stage.STARTING  # no back-off
    fx = h.report("learner", PodState.RUNNING, rpc=7100)
    assert sorted(launched(fx)) == ["rl-actors-0", "rl-actors-1", "rl-actors-2"]
    assert {o.env["ARRANGER_LEADER_ADDR"] for o in fx.launches} == {"10.0.0.2:7100"}


def test_a_report_of_an_old_attempt_gets_a_kill() -> None:
    h = Harness()
    h.start_all()
    h.report("actors-0", PodState.FAILED, exit_code=1)
    stale = PodReport("j/rl-actors-0", 0, PodState.RUNNING, pid=5)
    fx = h.c.pod_reports("n1", [stale], h.now)
    assert [(k.pod_uid, k.attempt) for k in fx.kills] == [("j/rl-actors-0", 0)]


def test_an_agent_that_comes_back_without_a_pod_loses_it_and_gets_lost_launches_again() -> None:
    h = Harness()
    h.place(learner="n1", **{"actors-0": "n1", "actors-1": "n2", "actors-2": "n2"})
    assert h.pod("learner").state == PodState.LAUNCHING
    fx = h.c.node_registered(NodeRegistration("n1", "10.0.0.1", 8000, 2**33), h.now)
    assert launched(fx) == ["rl-learner"] and h.pod("learner").attempt == 0


@pytest.mark.parametrize("gpus", [(GpuShare(0, 1000),), ()])
def test_gpus_reach_the_launch_order(gpus: tuple[GpuShare, ...]) -> None:
    h = Harness()
    plan = Plan(
        [Placement("j", "rl-learner", "n1", gpus)],
        {"j": JobDecision("j", ScheduleState.SCHEDULED_PARTLY)},
    )
    fx = h.c.apply_plan(plan, h.now)
    assert fx.launches[0].gpus == gpus


def test_a_kill_lost_with_a_dropped_stream_is_sent_again_when_the_agent_returns() -> None:
    h = Harness()
    h.start_all()
    h.c.node_disconnected("n2", h.now)
    h.c.stop(h.job, h.now)  # the kills for n2's pods go nowhere
    running = [PodReport(h.pod(f"actors-{i}").uid, 0, PodState.RUNNING, pid=9) for i in (1, 2)]
    fx = h.c.node_registered(
        NodeRegistration("n2", "10.0.0.2", 8000, 2**33, pods=tuple(running)), h.now
    )
    assert sorted(k.pod_uid for k in fx.kills) == ["j/rl-actors-1", "j/rl-actors-2"]


def test_evicted_workers_return_to_pending_with_the_job_grace_and_no_restart() -> None:
    h = Harness()
    h.start_all()
    evictions = [
        Eviction(
            "j", "rl-actors-2", "n2", "other", "preempted by job other (priority 9, queue default)"
        )
    ]
    fx = h.c.apply_plan(Plan(evictions=evictions), h.now)
    assert [(k.pod_uid, k.grace_s) for k in fx.kills] == [("j/rl-actors-2", 10.0)]
    assert any(e.kind == "Preempted" and "preempted by job other" in e.message for e in fx.events)
    h.report("actors-2", PodState.KILLED, exit_code=143)
    pod = h.pod("actors-2")
    assert pod.state == PodState.PENDING and pod.node == "" and pod.attempt == 1
    assert h.job.stage == Stage.RUNNING and h.job.set_restarts == {}


def test_evicting_a_minimum_sends_the_whole_job_back_to_pending() -> None:
    h = Harness()
    h.start_all()
    h.job.spec = dataclasses.replace(h.job.spec, preemption_grace_s=30.0)
    evictions = [Eviction("j", "rl-learner", "n1", "other", "preempted by job other")]
    fx = h.c.apply_plan(Plan(evictions=evictions), h.now)
    assert sorted(k.pod_uid for k in fx.kills) == [
        "j/rl-actors-0",
        "j/rl-actors-1",
        "j/rl-actors-2",
        "j/rl-learner",
    ]
    assert {k.grace_s for k in fx.kills} == {30.0}
    assert (
        h.job.stage == Stage.PENDING
        and h.job.reason == "Preempted"
        and h.job.waiting_since == h.now
    )
    for name in ("learner", "actors-0", "actors-1", "actors-2"):
        h.report(name, PodState.KILLED, exit_code=143)
    assert all(p.state == PodState.PENDING and not p.node for p in h.job.pods.values())
    assert h.job.stage == Stage.PENDING and h.job.leader_restarts == 0 and h.job.set_restarts == {}


def test_a_job_past_its_max_runtime_fails() -> None:
    h = Harness()
    h.job.spec = dataclasses.replace(h.job.spec, max_runtime_s=50.0)
    h.start_all()
    assert h.c.timer(h.job.id) == h.now + 50.0
    assert h.job.stage == Stage.RUNNING and not h.c.tick(h.now + 49).kills
    fx = h.c.tick(h.now + 50)
    assert (
        h.job.stage == Stage.FAILED and h.job.reason == "MaxRuntimeExceeded" and len(fx.kills) == 4
    )


def test_checkpoints_confirmed_in_a_loop_are_kept_at_most_once_a_second() -> None:
    h = Harness()
    h.start_all()
    first = h.c.confirm_checkpoint(h.job, h.now)
    assert first and h.job.checkpoint_time == h.now
    for step in (0.1, 0.5, 0.99):  # a learner confirming in a loop: nothing more to store
        later = h.c.confirm_checkpoint(h.job, h.now + step)
        assert later is not None and not later
        assert h.job.checkpoint_time == h.now
    kept = h.c.confirm_checkpoint(h.job, h.now + 1.0)
    assert kept and h.job.checkpoint_time == h.now + 1.0


def test_a_job_whose_pods_ended_before_the_news_came_ended_then() -> None:
    # The pods ended at 130 (their agents' clocks, measured 0 off the server's); their agents
    # came back and said so at 200: the job, its pods and their usage end at 130.
    h = Harness()
    h.place(learner="n1", **{f"actors-{i}": "n1" for i in range(3)})
    for name in ("learner", "actors-0", "actors-1", "actors-2"):
        h.report(name, PodState.RUNNING, rpc=7000)
    h.c.nodes["n1"].clock_offset = 0.0
    h.now = 200.0
    reports = [  # all at once, as the agent says when it registers again
        PodReport(
            p.uid, p.attempt, PodState.SUCCEEDED, exit_code=0, start_time=100.0, finish_time=130.0
        )
        for p in h.job.pods.values()
    ]
    h.c.pod_reports("n1", reports, h.now)
    assert h.job.stage == Stage.SUCCEEDED
    assert h.job.finish_time == 130.0
    assert all(p.finish_time == 130.0 for p in h.job.pods.values())
    cores = sum(
        h.job.spec.template_of(p.worker_set).resources.cpu_milli for p in h.job.pods.values()
    )
    assert h.job.cpu_core_s == pytest.approx(cores / 1000 * 30.0)
