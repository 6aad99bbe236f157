"""When preempt and reclaim evict nothing for a waiting job, the plan says why, with a reason
constant, and the job's message says it in words."""

from __future__ import annotations

from arranger.sched import Res, SchedulerConfig, run_cycle
from arranger.sched.plan import Plan
from tests.sched.builders import gang, node, queue, snapshot
from tests.sched.test_preemption import running_job

FULL = [node("n", cpu=8, used_cpu=8)]


def refused(plan: Plan, job_id: str) -> dict[str, str]:
    return {r.action: r.reason for r in plan.refusals if r.job_id == job_id}


def test_victims_of_equal_or_higher_priority_are_named() -> None:
    plan = run_cycle(snapshot(FULL, [running_job("other", 8, 2, 5), gang("j", workers=1)]))
    assert plan.evictions == []
    assert refused(plan, "j") == {
        "preempt": "VictimNotLowerPriority",
        "reclaim": "QueueNotBelowShare",
    }
    message = plan.decisions["j"].message
    assert message.endswith(
        "; preempt refused (VictimNotLowerPriority): 1 running jobs not of lower priority"
        "; reclaim refused (QueueNotBelowShare): its queue is not below its deserved share"
    )
    assert plan.decisions["j"].reason == "Unschedulable"  # the placement's verdict stays


def test_opted_out_victims_are_named() -> None:
    shielded = running_job("vip", 8, 2, priority=9, preemptible=False)
    plan = run_cycle(snapshot(FULL, [shielded, gang("top", workers=1, priority=10)]))
    assert refused(plan, "top")["preempt"] == "VictimOptedOut"
    assert "1 opted out (preemptible: false)" in plan.decisions["top"].message


def test_victims_that_would_not_make_room_are_named() -> None:
    low = running_job("low", pods=4, minimum=2, priority=3)
    high = running_job("high", pods=4, minimum=4, priority=9)
    plan = run_cycle(snapshot(FULL, [low, high, gang("big", workers=5, priority=5)]))
    assert plan.evictions == [] and refused(plan, "big")["preempt"] == "EvictionMakesNoRoom"
    assert plan.decisions["big"].message.endswith(
        "preempt refused (EvictionMakesNoRoom): 1 running jobs not of lower priority, evicting"
        " the 1 it may take would not make room for its minimum; reclaim refused"
        " (QueueNotBelowShare): its queue is not below its deserved share"
    )


def test_a_victim_queue_that_would_cross_below_its_share_is_named() -> None:
    queues = [queue("a"), queue("b")]
    fair = running_job("fair", pods=5, minimum=1, priority=1, queue_name="b")
    others = running_job("others", pods=3, minimum=3, priority=1, queue_name="a")
    wants = gang("wants", workers=2, priority=1, queue="a", cpu=2)
    plan = run_cycle(snapshot(FULL, [fair, others, wants], queues=queues))
    assert plan.evictions == [] and refused(plan, "wants")["reclaim"] == "WouldCrossShares"
    assert (
        "1 would go below their queue's deserved share while its queue went above its own"
        in plan.decisions["wants"].message
    )


def test_a_victim_queue_not_above_its_share_is_named() -> None:
    queues = [queue("a"), queue("b")]
    mine = running_job("mine", pods=4, minimum=4, priority=5, queue_name="a")
    theirs = running_job("theirs", pods=4, minimum=4, priority=1, queue_name="b")
    high = gang("high", workers=1, priority=9, queue="a")
    plan = run_cycle(snapshot(FULL, [mine, theirs, high], queues=queues))
    # mine is of lower priority in the same queue: it may go, but taking it makes room.
    assert {e.job_id for e in plan.evictions} == {"mine"}
    plan = run_cycle(
        snapshot(FULL, [theirs, running_job("top", 4, 4, 9, queue_name="a"), high], queues=queues)
    )
    assert refused(plan, "high")["preempt"] == "VictimNotLowerPriority"
    assert "1 in queues not above their deserved share" in plan.decisions["high"].message


def test_preemption_not_tried_says_why() -> None:
    config = SchedulerConfig(actions=("enqueue", "allocate", "backfill"))
    plan = run_cycle(snapshot(FULL, [running_job("low", 8, 2, 1), gang("j", workers=1)]), config)
    assert refused(plan, "j") == {"preempt": "PreemptionNotTried"}
    assert plan.decisions["j"].message.endswith(
        "; preempt not tried (PreemptionNotTried): preempt and reclaim are not among the"
        " scheduler's actions"
    )
    over = [queue("capped", cpu=4, allocated=Res(5000, 0, 0))]
    plan = run_cycle(
        snapshot([node("n", cpu=16)], [gang("k", workers=1, queue="capped")], queues=over)
    )
    assert refused(plan, "k") == {"preempt": "PreemptionNotTried"}
    assert plan.decisions["k"].reason == "QueueAtCapability"
    assert plan.decisions["k"].message.endswith(
        "it was not admitted (its queue is over its capability)"
    )


def test_a_job_being_made_room_for_has_no_refusal() -> None:
    plan = run_cycle(
        snapshot(FULL, [running_job("low", 8, 2, 3), gang("high", workers=2, priority=8)])
    )
    assert plan.evictions and refused(plan, "high") == {}
