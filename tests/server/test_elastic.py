"""Elastic worker sets and eviction notices in the controller: stimuli in, effects out, the
clock injected."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import grpc
import pytest

from arranger.client.channel import ArrangerError
from arranger.client.sdk import AsyncClient
from arranger.client.specfile import load_job_yaml
from arranger.sched import JobDecision, Placement, Plan, run_cycle
from arranger.sched.plan import Eviction
from arranger.server.controller import Controller, ControllerConfig
from arranger.server.convert import spec_from_json, spec_to_json
from arranger.server.effects import Effects
from arranger.server.model import SCHEDULER, JobRecord, PodRecord
from arranger.server.nodes import NodeRegistration, PodReport
from arranger.server.queues import QueueRecord
from arranger.server.scaling import scale_problem
from arranger.server.snapshot import SchedulingState, build_snapshot, part_of
from arranger.server.validation import SpecInvalid, parse_job
from arranger.states import SCALED_DOWN, PodState, ScheduleState, Stage
from tests.conftest import FAST, bare_server, job_spec

SPEC = """
metadata: {name: rl}
spec:
  minWorkersNum: 2
  preemptionGraceSeconds: 7
  evictionNoticeSeconds: 20
  leader: {name: learner, template: {command: [l]}}
  workerSets:
    - {name: actors, counts: 2, maxCounts: 5, template: {command: [a]}}
    - {name: evals, counts: 1, maxCounts: 3, template: {command: [e]}}
"""


class Elastic:
    """Elastic drives one elastic job on two nodes."""

    def __init__(self, spec: str = SPEC) -> None:
        self.c = Controller(ControllerConfig(max_eviction_notice_s=60.0))
        self.now = 100.0
        for name in ("n1", "n2"):
            self.c.node_registered(NodeRegistration(name, f"10.0.0.{name[1]}", 8000, 2**33), 0)
        job_spec = parse_job(load_job_yaml(spec))
        self.job, self.fx = self.c.submit("j", job_spec, spec_to_json(job_spec), self.now)

    def pod(self, name: str) -> PodRecord:
        return self.job.pods[f"rl-{name}"]

    def place(self, *names: str, node: str = "n1") -> Effects:
        placements = [Placement("j", f"rl-{name}", node) for name in names]
        decision = {"j": JobDecision("j", ScheduleState.SCHEDULED_SUCCEED)}
        self.fx = self.c.apply_plan(Plan(placements, decision), self.now)
        return self.fx

    def report(self, name: str, state: PodState, **ports: int) -> Effects:
        pod = self.pod(name)
        exit_code = None if state == PodState.RUNNING else 143
        report = PodReport(pod.uid, pod.attempt, state, pid=10, exit_code=exit_code, ports=ports)
        self.fx = self.c.pod_reports(pod.node, [report], self.now)
        return self.fx

    def start(self) -> None:
        self.place("learner", "actors-0", "actors-1", "evals-0")
        self.report("learner", PodState.RUNNING, rpc=7000)
        for name in ("actors-0", "actors-1", "evals-0"):
            self.report(name, PodState.RUNNING)

    def scale(self, worker_set: str, counts: int) -> Effects:
        problem = scale_problem(self.job, worker_set, counts)
        assert problem is None, problem
        self.fx = self.c.scale(self.job, worker_set, counts, self.now, "alice")
        return self.fx

    def evict(self, *names: str) -> Effects:
        evictions = [
            Eviction("j", f"rl-{n}", self.pod(n).node, "hi", "preempted by job hi") for n in names
        ]
        self.fx = self.c.apply_plan(Plan(evictions=evictions), self.now)
        return self.fx


def test_ranks_leave_room_for_each_set_up_to_its_max_counts() -> None:
    e = Elastic()
    ranks = {p.name: p.rank for p in e.job.workers()}
    assert ranks == {"rl-actors-0": 0, "rl-actors-1": 1, "rl-evals-0": 5}
    assert e.job.spec.num_workers == 3


def test_scaling_up_adds_surplus_workers_with_their_ranks_and_the_new_total() -> None:
    e = Elastic()
    e.start()
    fx = e.scale("actors", 4)
    assert fx.schedule and any(ev.kind == "Scaled" and "2 to 4" in ev.message for ev in fx.events)
    added = [e.pod("actors-2"), e.pod("actors-3")]
    assert all(p.state == PodState.PENDING and not p.in_minimum for p in added)
    assert [p.rank for p in added] == [2, 3]
    assert list(e.job.pods)[:5] == [
        "rl-learner",
        "rl-actors-0",
        "rl-actors-1",
        "rl-actors-2",
        "rl-actors-3",
    ]
    fx = e.place("actors-2", "actors-3", node="n2")
    env = {o.pod_name: o.env for o in fx.launches}
    assert env["rl-actors-3"]["ARRANGER_WORKER_RANK"] == "3"
    assert env["rl-actors-3"]["ARRANGER_NUM_WORKERS"] == "5"
    assert spec_from_json(e.job.spec_json) == e.job.spec  # what a restarted server reads


def test_scaling_down_stops_the_highest_indices_with_the_grace_and_counts_no_restart() -> None:
    e = Elastic()
    e.start()
    e.scale("actors", 4)
    e.scale("actors", 5)
    e.place("actors-2", "actors-3", node="n2")  # actors-4 is not placed
    e.report("actors-2", PodState.RUNNING)
    fx = e.scale("actors", 1)
    assert [(k.pod_uid, k.grace_s, k.reason) for k in fx.kills] == [
        ("j/rl-actors-3", 7.0, SCALED_DOWN),
        ("j/rl-actors-2", 7.0, SCALED_DOWN),
        ("j/rl-actors-1", 7.0, SCALED_DOWN),
    ]  # the highest index first; actors-4 never ran: it ends at once
    assert e.pod("actors-4").done and e.pod("actors-4").reason == SCALED_DOWN
    for name in ("actors-3", "actors-2", "actors-1"):
        e.report(name, PodState.KILLED)
        pod = e.pod(name)
        assert pod.done and pod.reason == SCALED_DOWN and pod.state == PodState.KILLED
    assert e.job.stage == Stage.RUNNING and e.job.set_restarts == {}
    assert [p.name for p in e.job.workers()] == ["rl-actors-0", "rl-evals-0"]
    assert all(p.in_minimum for p in e.job.workers())  # the minimum moved to who runs


def test_a_worker_scaled_down_and_up_again_runs_again_where_it_was() -> None:
    e = Elastic()
    e.start()
    e.scale("actors", 1)
    e.scale("actors", 2)  # actors-1 is still stopping
    e.report("actors-1", PodState.KILLED)
    pod = e.pod("actors-1")
    assert not pod.done and pod.attempt == 1 and pod.node == "n1"
    e.scale("evals", 0)
    e.report("evals-0", PodState.KILLED)
    e.scale("evals", 1)  # ended: its next attempt waits for the scheduler
    pod = e.pod("evals-0")
    assert pod.state == PodState.PENDING and pod.attempt == 1 and not pod.done


@pytest.mark.parametrize(
    ("worker_set", "counts", "field"),
    [
        ("actors", 6, "maxCounts (5)"),
        ("evals", -1, "minCount (0)"),
        ("nope", 1, "workerSet"),
        ("actors", 0, "minWorkersNum (2)"),
    ],
)
def test_a_scale_outside_the_range_is_refused_naming_the_rule(
    worker_set: str, counts: int, field: str
) -> None:
    e = Elastic()
    e.scale("evals", 0)
    problem = scale_problem(e.job, worker_set, counts)
    assert problem is not None and field in problem[1]


@pytest.mark.parametrize(
    ("change", "field"),
    [("counts: 6, maxCounts: 5", "counts"), ("counts: 2, maxCounts: 0", "maxCounts")],
)
def test_a_spec_whose_range_is_wrong_is_refused_naming_the_field(change: str, field: str) -> None:
    spec = SPEC.replace("counts: 2, maxCounts: 5", change)
    with pytest.raises(SpecInvalid, match=rf"spec\.workerSets\[0\]\.{field}"):
        parse_job(load_job_yaml(spec))


def test_a_gang_job_has_a_fixed_size_and_notice_must_not_be_negative() -> None:
    gang = SPEC.replace(
        "minWorkersNum: 2", "minWorkersNum: 2\n  schedulerPolicy: {basicPolicy: Gang}"
    )
    with pytest.raises(SpecInvalid, match=r"maxCounts: a Gang job's sets have a fixed size"):
        parse_job(load_job_yaml(gang))
    with pytest.raises(SpecInvalid, match=r"spec\.evictionNoticeSeconds"):
        parse_job(
            load_job_yaml(SPEC.replace("evictionNoticeSeconds: 20", "evictionNoticeSeconds: -1"))
        )


def test_surplus_workers_get_notice_stay_claimed_and_go_when_it_ends() -> None:
    e = Elastic()
    e.start()
    e.scale("actors", 3)
    e.place("actors-2", node="n2")
    e.report("actors-2", PodState.RUNNING)
    fx = e.evict("actors-2")
    assert not fx.kills and e.pod("actors-2").evict_at == e.now + 20
    assert any(
        ev.kind == "EvictionNotice" and "rl-actors-2 in 20 s" in ev.message for ev in fx.events
    )
    info = part_of(e.job).info
    assert info is not None
    assert [p.name for p in info.running if p.terminating] == ["rl-actors-2"]  # room on its way
    assert not e.evict("actors-2").kills  # taken again by a later cycle: nothing new
    assert e.c.timer("j") == e.now + 20
    assert not e.c.tick(e.now + 19).kills
    fx = e.c.tick(e.now + 20)
    assert [(k.pod_uid, k.grace_s) for k in fx.kills] == [("j/rl-actors-2", 7.0)]
    assert e.pod("actors-2").requeue == SCHEDULER and e.pod("actors-2").evict_at is None
    assert any(ev.kind == "NoticeEnded" for ev in fx.events)


def test_the_whole_job_is_told_and_goes_when_its_learner_has_checkpointed() -> None:
    e = Elastic()
    e.start()
    fx = e.evict("actors-0")  # in the minimum: the whole job goes
    assert not fx.kills and e.pod("learner").evict_at == e.now + 20
    assert all(p.evict_at == e.now + 20 for p in e.job.pods.values())
    assert e.job.stage == Stage.RUNNING
    e.now += 4.5
    fx = e.c.confirm_checkpoint(e.job, e.now)
    assert fx is not None and len(fx.kills) == 4
    assert e.job.stage == Stage.PENDING and e.job.reason == "Preempted"
    checkpointed = [ev for ev in fx.events if ev.kind == "Checkpointed"]
    assert checkpointed and "15.5 s of notice left" in checkpointed[0].message
    assert e.job.message.endswith("evicted once the learner checkpointed (15.5 s early)")
    assert e.job.checkpoint_time == e.now
    e.now += 1.0
    again = e.c.confirm_checkpoint(e.job, e.now)  # nothing waits any more: only kept
    assert again is not None and not again.kills and not again.events
    assert again.jobs == {e.job.id} and e.job.checkpoint_time == e.now


def test_a_checkpoint_is_kept_without_a_notice_and_reaches_the_snapshot() -> None:
    e = Elastic()
    e.start()
    assert e.job.checkpoint_time is None
    assert build_snapshot(e.c, e.now).jobs[0].checkpoint_time is None
    e.now += 3.0
    fx = e.c.confirm_checkpoint(e.job, e.now)
    assert fx is not None and not fx.kills and not fx.events and fx.jobs == {e.job.id}
    assert e.job.stage == Stage.RUNNING and e.job.checkpoint_time == e.now
    (info,) = build_snapshot(e.c, e.now).jobs
    assert info.checkpoint_time == e.now
    e.c.stop(e.job, e.now)
    for pod in e.job.pods.values():  # every pod ends: the job has ended
        e.c.pod_reports(pod.node, [PodReport(pod.uid, pod.attempt, PodState.KILLED)], e.now)
    assert e.job.stage.finished
    assert e.c.confirm_checkpoint(e.job, e.now + 1) is None  # an ended job keeps none
    assert e.job.checkpoint_time == e.now


def test_the_whole_job_goes_when_its_notice_ends_without_an_answer() -> None:
    e = Elastic()
    e.start()
    e.evict("learner")
    fx = e.c.tick(e.now + 20)
    assert len(fx.kills) == 4 and e.job.stage == Stage.PENDING
    assert e.job.message == "preempted by job hi; evicted when its notice ended"
    assert any(ev.kind == "NoticeEnded" and "the whole job" in ev.message for ev in fx.events)


def test_without_notice_an_eviction_is_at_once_and_the_notice_is_capped() -> None:
    # A job stored before the maximum was lowered gets the maximum.
    e = Elastic(SPEC.replace("evictionNoticeSeconds: 20", "evictionNoticeSeconds: 600"))
    assert e.c.notice_of(e.job) == 60.0
    e = Elastic(SPEC.replace("evictionNoticeSeconds: 20", "evictionNoticeSeconds: 0"))
    e.start()
    assert len(e.evict("actors-1").kills) == 4 and e.job.stage == Stage.PENDING


async def test_a_submit_asking_more_than_the_servers_maxima_is_refused_naming_each(
    tmp_path: Path,
) -> None:
    capped = ControllerConfig(max_eviction_notice_s=60.0, max_preemption_grace_s=30.0)
    config = dataclasses.replace(FAST, controller=capped)
    async with (
        bare_server(tmp_path / "server", config) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        body = job_spec("long", ["true"])
        body["spec"].update(evictionNoticeSeconds=61, preemptionGraceSeconds=45)  # type: ignore[union-attr]
        with pytest.raises(ArrangerError) as refused:
            await client.submit(body)
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.message == (
            "spec.preemptionGraceSeconds: 45 is above this server's maximum of 30 "
            "(maxPreemptionGraceSeconds); spec.evictionNoticeSeconds: 61 is above this "
            "server's maximum of 60 (maxEvictionNoticeSeconds)"
        )
        body["spec"].update(evictionNoticeSeconds=60, preemptionGraceSeconds=30)  # type: ignore[union-attr]
        assert (await client.submit(body)).metadata.name == "long"


def test_the_maxima_are_said_as_written() -> None:
    config = ControllerConfig(max_eviction_notice_s=300.0, max_preemption_grace_s=1234567.0)
    spec = parse_job(
        load_job_yaml(
            SPEC.replace("evictionNoticeSeconds: 20", "evictionNoticeSeconds: 300.0000001")
        )
    )
    assert config.above_maxima(spec) == [
        "spec.evictionNoticeSeconds: 300.0000001 is above this server's maximum of 300 "
        "(maxEvictionNoticeSeconds)"
    ]


class Cluster:
    """Cluster: the controller and the real scheduling core, cycle by cycle, with agents
    played by reports (every launched pod runs; every killed pod ends)."""

    def __init__(self, cpu_per_node: int = 4) -> None:
        self.c = Controller()
        self.now = 10.0
        for name in ("n1", "n2"):
            reg = NodeRegistration(name, f"10.0.0.{name[1]}", cpu_per_node * 1000, 2**34)
            self.c.node_registered(reg, 0)

    def submit(self, name: str, spec: str) -> JobRecord:
        parsed = parse_job(load_job_yaml(spec.replace("NAME", name)))
        return self.c.submit(name, parsed, spec_to_json(parsed), self.now)[0]

    def cycle(self, rounds: int = 6) -> None:
        """cycle runs the scheduler and answers the orders until nothing changes."""
        for _ in range(rounds):
            self.now += 1
            plan = run_cycle(build_snapshot(self.c, self.now))
            fx = self.c.apply_plan(plan, self.now)
            fx.merge(self.c.tick(self.now))
            self.answer(fx)

    def answer(self, fx: Effects) -> None:
        while fx.launches or fx.kills:
            more = Effects()
            for order in fx.launches:
                report = PodReport(
                    order.pod_uid,
                    order.attempt,
                    PodState.RUNNING,
                    pid=1,
                    ports={p: 7000 for p in order.ports},
                )
                more.merge(self.c.pod_reports(order.node, [report], self.now))
            for kill in fx.kills:
                found = self.c.view.pod(kill.pod_uid)
                if found is not None and found[1].live:
                    report = PodReport(kill.pod_uid, kill.attempt, PodState.KILLED, exit_code=143)
                    more.merge(self.c.pod_reports(kill.node, [report], self.now))
            fx = more


ONE_CORE = """
metadata: {name: NAME, queue: QUEUE}
spec:
  priority: PRIORITY
  leader: {name: l, template: {command: [l], resources: {cpu: 1}}}
  workerSets: [{name: a, counts: 1, maxCounts: 8, template: {command: [a], resources: {cpu: 1}}}]
"""


def one_core(queue: str = "default", priority: int = 5) -> str:
    return ONE_CORE.replace("QUEUE", queue).replace("PRIORITY", str(priority))


def test_growing_takes_free_room_only_never_another_jobs_minimum() -> None:
    cluster = Cluster()
    low = cluster.submit("low", one_core(priority=1))
    cluster.cycle()
    high = cluster.submit("high", one_core(priority=9))
    cluster.cycle()
    assert scale_problem(high, "a", 8) is None
    cluster.answer(cluster.c.scale(high, "a", 8, cluster.now))
    cluster.cycle()
    held = sum(1 for p in high.pods.values() if p.state == PodState.RUNNING)
    assert held == 6  # 8 cores less low's leader and worker: free room only
    assert all(p.state == PodState.RUNNING for p in low.pods.values())
    assert high.schedule_state == ScheduleState.SCHEDULED_PARTLY


def test_growing_keeps_to_the_queues_capability() -> None:
    cluster = Cluster()
    cluster.c.put_queue(QueueRecord("capped", cpu_milli=3000), cluster.now)
    job = cluster.submit("el", one_core("capped"))
    cluster.cycle()
    cluster.answer(cluster.c.scale(job, "a", 8, cluster.now))
    cluster.cycle()
    assert sum(1 for p in job.pods.values() if p.state == PodState.RUNNING) == 3
    assert "capability" in job.message


def test_growth_past_the_queues_share_is_given_back_to_a_queue_that_needs_it() -> None:
    """Two queues of equal weight on 8 cores: an elastic job alone grows onto all of them;
    when the other queue's job comes, reclaim takes back surplus workers until it runs, and
    the grown job keeps its gang minimum."""
    cluster = Cluster()
    for name in ("qa", "qb"):
        cluster.c.put_queue(QueueRecord(name), cluster.now)
    grown = cluster.submit("grown", one_core("qa"))
    cluster.cycle()
    cluster.answer(cluster.c.scale(grown, "a", 8, cluster.now))
    cluster.cycle()
    running = [p for p in grown.pods.values() if p.state == PodState.RUNNING]
    assert len(running) == 8  # the whole cluster: nobody else wants it
    other = cluster.submit("other", one_core("qb"))
    cluster.cycle()
    assert all(p.state == PodState.RUNNING for p in other.pods.values()), other.message
    kept = [p for p in grown.pods.values() if p.state == PodState.RUNNING]
    assert len(kept) == 6  # two surplus workers gave their cores back, waiting for room again
    assert all(p.state == PodState.RUNNING for p in grown.pods.values() if p.in_minimum)
    assert all(p.state == PodState.PENDING for p in grown.pods.values() if p not in kept)


RIVAL = """
metadata: {{name: {name}}}
spec:
  priority: {priority}
  evictionNoticeSeconds: {notice}
  leader: {{name: learner, template: {{command: [l], resources: {{cpu: "{cpu}"}}}}}}
  workerSets: [{{name: actors, template: {{command: [a], resources: {{cpu: "{cpu}"}}}}}}]
"""


class Rivals:
    """Cluster: the controller and the real scheduling core on one node of 8 cores, its
    processes answered at once (a launch runs, a kill ends)."""

    def __init__(self) -> None:
        self.c = Controller(ControllerConfig())
        self.now = 100.0
        self.state = SchedulingState(self.c)
        self.state.changed(
            self.c.node_registered(NodeRegistration("n1", "10.0.0.1", 8000, 2**33), 0)
        )

    def submit(self, name: str, priority: int, cpu: int, notice: int = 0) -> None:
        text = RIVAL.format(name=name, priority=priority, cpu=cpu, notice=notice)
        spec = parse_job(load_job_yaml(text))
        self.carry_out(self.c.submit(name, spec, spec_to_json(spec), self.now)[1])

    def cycle(self) -> Plan:
        plan = run_cycle(self.state.snapshot(self.now))
        self.carry_out(self.c.apply_plan(plan, self.now))
        return plan

    def carry_out(self, fx: Effects) -> None:
        """carry_out: what the agent does with the orders, and what follows, until quiet."""
        self.state.changed(fx)
        reports = [
            PodReport(o.pod_uid, o.attempt, PodState.RUNNING, pid=1, ports={"rpc": 7000})
            for o in fx.launches
        ]
        reports += [
            PodReport(k.pod_uid, k.attempt, PodState.KILLED, exit_code=143)
            for k in fx.kills
            if self.c.pod_by_uid(k.pod_uid)[1].live
        ]
        for report in reports:
            self.carry_out(self.c.pod_reports("n1", [report], self.now))


def test_room_freed_by_a_checkpointed_victim_stays_with_the_job_it_was_evicted_for() -> None:
    k = Rivals()
    k.submit("lo1", 2, 2, notice=30)
    k.submit("lo2", 2, 2, notice=30)
    k.cycle()
    assert all(k.c.jobs[j].stage == Stage.RUNNING for j in ("lo1", "lo2"))
    k.submit("hi", 8, 4)
    plan = k.cycle()
    assert {e.job_id for e in plan.evictions} == {"lo1", "lo2"}  # both whole, under notice
    k.now += 5
    fx = k.c.confirm_checkpoint(k.c.jobs["lo1"], k.now)  # lo1 goes first; lo2 keeps its notice
    assert fx is not None
    k.carry_out(fx)
    plan = k.cycle()
    # lo1's room is half of what hi waits for: it is not handed back to lo1 meanwhile.
    assert not [p for p in plan.placements if p.job_id == "lo1"]
    assert plan.decisions["hi"].reason == "Preempting"
    k.now += 5
    k.carry_out(k.c.confirm_checkpoint(k.c.jobs["lo2"], k.now) or Effects())
    plan = k.cycle()
    assert {p.job_id for p in plan.placements} == {"hi"} and not plan.evictions
    assert k.c.jobs["hi"].stage == Stage.RUNNING
