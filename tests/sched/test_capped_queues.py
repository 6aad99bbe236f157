"""A capped queue: a higher-priority gang of the queue evicts lower-priority work of the same
queue when its minimum would fit within the capability once that work is gone."""

from __future__ import annotations

from arranger.sched import run_cycle
from arranger.states import ScheduleState
from tests.sched.builders import gang, node, queue, snapshot
from tests.sched.simulator import Sim
from tests.sched.test_preemption import evicted, running_job


def test_a_high_priority_gang_evicts_surplus_workers_of_its_own_capped_queue() -> None:
    # capped holds 5 of its 6 cores (a priority-2 job: minimum 2, 3 surplus workers); the node
    # has room, but the high gang's 3 cores would take the queue to 8.
    low = running_job("low", pods=5, minimum=2, priority=2, queue_name="capped")
    high = gang("high", workers=2, priority=8, queue="capped")
    plan = run_cycle(
        snapshot([node("n", cpu=16, used_cpu=5)], [low, high], queues=[queue("capped", cpu=6)])
    )
    assert evicted(plan) == ["low-3", "low-4"]  # 5 - 2 + 3 = 6: just enough, newest first
    assert plan.decisions["high"].reason == "Preempting"


def test_a_victim_without_surplus_goes_whole_and_only_from_the_same_queue() -> None:
    small = running_job("small", pods=2, minimum=2, priority=1, queue_name="capped", started=9)
    big = running_job("big", pods=4, minimum=4, priority=1, queue_name="capped")
    high = gang("high", workers=2, priority=8, queue="capped")  # 3 cores; capability 7, 6 held
    plan = run_cycle(
        snapshot(
            [node("n", cpu=16, used_cpu=6)], [small, big, high], queues=[queue("capped", cpu=7)]
        )
    )
    assert evicted(plan) == ["small-0", "small-1"]  # the whole of the smaller gang


def test_equal_priority_work_of_the_queue_is_not_evicted_for_the_capability() -> None:
    same = running_job("same", pods=5, minimum=2, priority=8, queue_name="capped")
    high = gang("high", workers=2, priority=8, queue="capped")
    plan = run_cycle(
        snapshot([node("n", cpu=16, used_cpu=5)], [same, high], queues=[queue("capped", cpu=6)])
    )
    assert plan.evictions == []
    decision = plan.decisions["high"]
    assert decision.state == ScheduleState.UNSCHEDULED and decision.reason == "QueueAtCapability"


def test_work_of_other_queues_is_not_evicted_to_make_room_in_a_capability() -> None:
    # b is above its deserved share and lower in priority, but evicting it would not make
    # room in capped's capability; the node has room already.
    low = running_job("low", pods=5, minimum=2, priority=2, queue_name="capped", node_name="n1")
    other = running_job("other", pods=8, minimum=2, priority=1, queue_name="b", node_name="n2")
    nodes = [node("n1", cpu=8, used_cpu=5), node("n2", cpu=8, used_cpu=8)]
    high = gang("high", workers=2, priority=8, queue="capped")
    queues = [queue("capped", cpu=6), queue("b")]
    plan = run_cycle(snapshot(nodes, [low, other, high], queues=queues))
    assert evicted(plan) == ["low-3", "low-4"]


def test_the_high_gang_starts_once_the_evicted_pods_have_stopped() -> None:
    sim = Sim([node("n", cpu=16)], [queue("capped", cpu=6)], stop_cycles=2)
    sim.submit(gang("low", workers=5, minimum=1, priority=2, queue="capped"), duration=1000)
    sim.run(2)
    assert len(sim.jobs["low"].running) == 6  # at the capability
    sim.submit(gang("high", workers=2, priority=8, queue="capped", submit_time=2), duration=1000)
    sim.run(4)
    assert sim.jobs["high"].started is not None
    assert len(sim.jobs["low"].running) == 3 and sim.jobs["low"].started is not None
