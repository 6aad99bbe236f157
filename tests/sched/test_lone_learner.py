"""A job with no workers (a lone learner) in the pure core: placed by every placement and queue
policy, explained, preempted and preempting, reserved for when starved, like any other job."""

from __future__ import annotations

import dataclasses

import pytest

from arranger.sched import Res, SchedulerConfig, run_cycle
from arranger.sched.explain import explain
from arranger.sched.snapshot import JobInfo, RunningPod
from arranger.states import BasicPolicy, ScheduleState
from tests.sched.builders import GI, gang, node, queue, snapshot
from tests.sched.test_preemption import running_job


def lone(job_id: str, cpu: float = 1, **fields: object) -> JobInfo:
    return gang(job_id, workers=0, cpu=cpu, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", list(BasicPolicy))
@pytest.mark.parametrize("drf", [False, True], ids=["priority", "drf"])
def test_a_lone_learner_is_placed_by_every_policy(policy: BasicPolicy, drf: bool) -> None:
    nodes = [node("a", cpu=4), node("b", cpu=4, used_cpu=2, gpus=2)]
    jobs = [lone("solo", policy=policy, drf=drf), gang("pair", workers=1, policy=policy, drf=drf)]
    plan = run_cycle(snapshot(nodes, jobs, queues=[queue("default")]))
    assert [p.pod for p in plan.placements if p.job_id == "solo"] == ["solo-l"]
    decision = plan.decisions["solo"]
    assert decision.state == ScheduleState.SCHEDULED_SUCCEED, decision.message


def test_a_lone_learner_that_does_not_fit_waits_and_is_explained() -> None:
    snap = snapshot([node("a", cpu=2)], [lone("solo", cpu=4)])
    plan = run_cycle(snap)
    assert plan.placements == []
    assert plan.decisions["solo"].state == ScheduleState.UNSCHEDULED
    why = explain(snap, SchedulerConfig(), "solo")
    assert why is not None and not why.placed and [f.pod for f in why.fits] == ["solo-l"]


def test_a_lone_learner_preempts_and_is_preempted() -> None:
    low = JobInfo(
        id="low",
        name="low",
        queue="default",
        priority=2,
        submit_time=0.0,
        pending=(),
        running=(RunningPod("low-l", "a", Res(4000, GI, 0), in_minimum=True, start_time=1.0),),
        allocated=Res(4000, GI, 0),
        start_time=1.0,
    )
    plan = run_cycle(snapshot([node("a", cpu=4, used_cpu=4)], [low, lone("high", priority=9)]))
    assert [e.pod for e in plan.evictions] == ["low-l"]
    assert all(e.for_job == "high" for e in plan.evictions)


def test_a_starved_lone_learner_gets_a_reservation() -> None:
    nodes = [node(n, cpu=4, used_cpu=4) for n in "ab"]
    fillers = [running_job(f"f{n}", pods=4, minimum=4, priority=5, node_name=n) for n in "ab"]
    starved = dataclasses.replace(lone("big", cpu=3), waiting_since=0.0)
    config = SchedulerConfig(
        actions=("enqueue", "allocate", "backfill", "reserve"), starvation_threshold_s=10
    )
    plan = run_cycle(snapshot(nodes, [*fillers, starved], now=100.0), config)
    assert plan.placements == [] and plan.decisions["big"].state == ScheduleState.UNSCHEDULED
    assert plan.reservation is not None and plan.reservation.nodes == ("a",)
