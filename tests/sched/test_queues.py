"""Queues: deserved shares by weight, capability as a hard cap, queue and job order."""

from __future__ import annotations

from arranger.sched import Res, run_cycle
from arranger.sched.plugins.proportion import deserved_shares
from arranger.sched.session import QueueState
from arranger.states import ScheduleState
from tests.sched.builders import gang, node, queue, snapshot

CORE = 1000


def state(q, request: float) -> QueueState:  # type: ignore[no-untyped-def]
    return QueueState(q, q.held_outside, request=Res(round(request * CORE), 0, 0))


def test_deserved_is_split_by_weight() -> None:
    total = Res(12 * CORE, 0, 0)
    shares = deserved_shares(total, [state(queue("a", weight=2), 100), state(queue("b"), 100)])
    assert shares["a"].cpu_milli == 8 * CORE and shares["b"].cpu_milli == 4 * CORE


def test_deserved_is_capped_by_request_and_the_rest_goes_to_others() -> None:
    total = Res(12 * CORE, 0, 0)
    shares = deserved_shares(total, [state(queue("a", weight=2), 2), state(queue("b"), 100)])
    assert shares["a"].cpu_milli == 2 * CORE and shares["b"].cpu_milli == 10 * CORE


def test_deserved_is_capped_by_capability() -> None:
    total = Res(12 * CORE, 0, 0)
    shares = deserved_shares(total, [state(queue("a", cpu=3), 100), state(queue("b"), 100)])
    assert shares["a"].cpu_milli == 3 * CORE and shares["b"].cpu_milli == 9 * CORE


def test_a_queue_at_its_capability_gets_nothing_more() -> None:
    nodes = [node("n", cpu=16)]
    queues = [queue("capped", cpu=4, allocated=Res(3 * CORE, 0, 0))]
    plan = run_cycle(snapshot(nodes, [gang("j", workers=1, queue="capped")], queues=queues))
    decision = plan.decisions["j"]
    assert plan.placements == [] and decision.state == ScheduleState.UNSCHEDULED
    assert (
        decision.reason == "QueueAtCapability"
        and decision.message
        == "queue capped at capability cpu; preempt and reclaim refused"
        " (NoPreemptionVictims): no other job is running"
    )


def test_extra_workers_stop_at_the_capability() -> None:
    queues = [queue("capped", cpu=4)]
    plan = run_cycle(
        snapshot(
            [node("n", cpu=16)], [gang("j", workers=6, minimum=1, queue="capped")], queues=queues
        )
    )
    assert len(plan.placements) == 4
    assert plan.decisions["j"].message.endswith("queue capped at capability cpu")


def test_the_queue_furthest_below_its_share_goes_first() -> None:
    # One slot of 4 cores left; "rich" already holds 6 of its 8 deserved, "poor" nothing.
    nodes = [node("n", cpu=12, used_cpu=8)]
    queues = [queue("rich", allocated=Res(6 * CORE, 0, 0)), queue("poor")]
    rich = gang("r", workers=3, queue="rich", submit_time=1, priority=9)
    poor = gang("p", workers=3, queue="poor", submit_time=2, priority=1)
    plan = run_cycle(snapshot(nodes, [rich, poor], queues=queues))
    assert {p.job_id for p in plan.placements} == {"p"}
    assert plan.deserved["poor"].cpu_milli > 0


def test_drf_orders_equal_priority_jobs_by_dominant_share() -> None:
    nodes = [node("n", cpu=8, used_cpu=4)]
    big = gang("big", workers=1, cpu=2, drf=True, submit_time=1, allocated=Res(3 * CORE, 0, 0))
    small = gang("small", workers=1, cpu=2, drf=True, submit_time=2)
    plan = run_cycle(snapshot(nodes, [big, small]))
    assert {p.job_id for p in plan.placements} == {"small"}
    urgent = gang(
        "big", workers=1, cpu=2, drf=True, submit_time=1, allocated=Res(3 * CORE, 0, 0), priority=9
    )
    assert {p.job_id for p in run_cycle(snapshot(nodes, [urgent, small])).placements} == {"big"}


def test_a_job_that_waits_past_its_schedule_timeout_fails() -> None:
    busy = [node("n", cpu=4, used_cpu=4)]
    waiting = gang("j", workers=1, schedule_timeout_s=30, submit_time=0)
    assert (
        run_cycle(snapshot(busy, [waiting], now=29)).decisions["j"].state
        == ScheduleState.UNSCHEDULED
    )
    decision = run_cycle(snapshot(busy, [waiting], now=30)).decisions["j"]
    assert decision.state == ScheduleState.SCHEDULED_FAILED and decision.reason == "ScheduleTimeout"
    assert decision.message.startswith(
        "not placed within scheduleTimeoutSeconds (30): 0/1 nodes fit"
    )


def test_a_failed_gang_gives_its_queue_back_what_it_tried() -> None:
    # The gang places 2 pods, fails on the 3rd, and must leave its queue's account as it was:
    # otherwise the next job would see the queue at 2 + 2 > 3.
    queues = [queue("q", cpu=3)]
    greedy = gang("greedy", workers=2, queue="q", priority=9)  # 3 cores; the node has 2
    modest = gang("modest", workers=1, queue="q", priority=1)  # 2 cores
    plan = run_cycle(snapshot([node("n", cpu=4, used_cpu=2)], [greedy, modest], queues=queues))
    assert {p.job_id for p in plan.placements} == {"modest"}
