"""Preempt and reclaim in the pure core: who is evicted, and only when it helps."""

from __future__ import annotations

from arranger.sched import Res, SchedulerConfig, run_cycle
from arranger.sched.snapshot import JobInfo, PodRequest, RunningPod
from arranger.states import Role, ScheduleState
from tests.sched.builders import GI, gang, node, queue, snapshot

CORE = 1000


def running_job(
    job_id: str,
    pods: int,
    minimum: int,
    priority: int,
    started: float = 0.0,
    queue_name: str = "default",
    node_name: str = "n",
    preemptible: bool = True,
    terminating: bool = False,
) -> JobInfo:
    """running_job: a job whose `pods` one-core pods all run on one node; the first `minimum`
    are its gang minimum (the leader first); later pods started later."""
    running = tuple(
        RunningPod(
            f"{job_id}-{i}",
            node_name,
            Res(CORE, GI, 0),
            in_minimum=i < minimum,
            start_time=started + i,
            terminating=terminating,
        )
        for i in range(pods)
    )
    return JobInfo(
        id=job_id,
        name=job_id,
        queue=queue_name,
        priority=priority,
        submit_time=started,
        pending=(),
        running=running,
        allocated=Res(CORE * pods, GI * pods, 0),
        start_time=started,
        preemptible=preemptible,
    )


def evicted(plan) -> list[str]:  # type: ignore[no-untyped-def]
    return sorted(e.pod for e in plan.evictions)


def test_surplus_workers_go_first_most_recently_started_first() -> None:
    low = running_job("low", pods=8, minimum=2, priority=3)
    high = gang("high", workers=2, priority=8)
    plan = run_cycle(snapshot([node("n", cpu=8, used_cpu=8)], [low, high]))
    assert evicted(plan) == ["low-5", "low-6", "low-7"]
    assert plan.placements == []  # placed once the evicted pods have stopped
    decision = plan.decisions["high"]
    assert decision.state == ScheduleState.UNSCHEDULED and decision.reason == "Preempting"
    assert decision.message == "preempted 3 pods of low; starts when they have stopped"
    assert all(
        e.for_job == "high" and "preempted by job high (priority 8" in e.reason
        for e in plan.evictions
    )


def test_a_job_below_its_minimum_is_evicted_whole() -> None:
    low = running_job("low", pods=8, minimum=8, priority=3)  # no surplus
    plan = run_cycle(
        snapshot([node("n", cpu=8, used_cpu=8)], [low, gang("high", workers=2, priority=8)])
    )
    assert evicted(plan) == [f"low-{i}" for i in range(8)]


def test_victims_are_the_fewest_pods_then_lowest_priority_then_newest() -> None:
    nodes = [node("n", cpu=8, used_cpu=8)]
    big = running_job("big", pods=5, minimum=5, priority=1)
    small = running_job("small", pods=3, minimum=3, priority=4)
    plan = run_cycle(snapshot(nodes, [big, small, gang("high", workers=1, priority=8)]))
    assert evicted(plan) == ["small-0", "small-1", "small-2"]  # 3 pods disturb less than 5
    old = running_job("old", pods=4, minimum=4, priority=2, started=0)
    new = running_job("new", pods=4, minimum=4, priority=2, started=50)
    plan = run_cycle(snapshot(nodes, [old, new, gang("high", workers=1, priority=8)]))
    assert evicted(plan) == [f"new-{i}" for i in range(4)]  # the least work lost


def test_nothing_is_evicted_unless_it_lets_the_minimum_fit() -> None:
    low = running_job("low", pods=8, minimum=2, priority=3)
    plan = run_cycle(
        snapshot([node("n", cpu=8, used_cpu=8)], [low, gang("huge", workers=20, priority=9)])
    )
    assert plan.evictions == []


def test_equal_or_higher_priority_is_never_preempted() -> None:
    nodes = [node("n", cpu=8, used_cpu=8)]
    for priority in (5, 6):
        plan = run_cycle(
            snapshot(
                nodes, [running_job("other", 8, 2, priority), gang("j", workers=1, priority=5)]
            )
        )
        assert plan.evictions == []


def test_opting_out_is_honoured_only_from_the_configured_priority() -> None:
    nodes = [node("n", cpu=8, used_cpu=8)]
    config = SchedulerConfig(opt_out_min_priority=8)
    shielded = running_job("vip", 8, 2, priority=9, preemptible=False)
    plan = run_cycle(snapshot(nodes, [shielded, gang("top", workers=1, priority=10)]), config)
    assert plan.evictions == []
    cheeky = running_job("cheap", 8, 2, priority=3, preemptible=False)
    plan = run_cycle(snapshot(nodes, [cheeky, gang("top", workers=1, priority=10)]), config)
    assert evicted(plan) == ["cheap-6", "cheap-7"]


def test_while_evicted_pods_stop_nothing_more_is_evicted() -> None:
    nodes = [node("n", cpu=8, used_cpu=8)]
    stopping = running_job("going", pods=2, minimum=2, priority=3, terminating=True)
    low = running_job("low", pods=6, minimum=1, priority=3)
    plan = run_cycle(snapshot(nodes, [stopping, low, gang("high", workers=1, priority=8)]))
    assert plan.evictions == []
    assert plan.decisions["high"].message == "waiting for evicted pods to stop (2 stopping)"


def test_preempting_across_queues_only_takes_from_queues_above_their_share() -> None:
    nodes = [node("n", cpu=8, used_cpu=8)]
    queues = [queue("a"), queue("b")]
    hog = running_job(
        "hog", pods=8, minimum=1, priority=3, queue_name="b"
    )  # b holds 8, deserves 4ish
    high = gang("high", workers=1, priority=8, queue="a")
    plan = run_cycle(snapshot(nodes, [hog, high], queues=queues))
    assert evicted(plan) == ["hog-6", "hog-7"]


def test_reclaim_takes_back_for_a_queue_below_its_share_whatever_the_priority() -> None:
    nodes = [node("n", cpu=8, used_cpu=8)]
    queues = [queue("a"), queue("b")]
    hog = running_job("hog", pods=8, minimum=1, priority=9, queue_name="b")
    meek = gang("meek", workers=1, priority=1, queue="a")
    plan = run_cycle(snapshot(nodes, [hog, meek], queues=queues))
    assert evicted(plan) == ["hog-6", "hog-7"]
    assert all(e.reason.startswith("reclaimed by job meek") for e in plan.evictions)


def test_reclaim_never_takes_a_queue_below_its_deserved_share() -> None:
    nodes = [node("n", cpu=8, used_cpu=8)]
    queues = [queue("a"), queue("b")]
    # a wants 6 of 8 cores; b holds 5 and deserves 4 (b's own demand): only 1 core can come back.
    fair = running_job("fair", pods=5, minimum=1, priority=1, queue_name="b")
    others = running_job("others", pods=3, minimum=3, priority=1, queue_name="a")
    wants = gang("wants", workers=2, priority=1, queue="a", cpu=2)
    plan = run_cycle(snapshot(nodes, [fair, others, wants], queues=queues))
    assert plan.evictions == []


def test_reclaim_takes_only_what_keeps_the_other_queue_at_its_share() -> None:
    nodes = [node("n", cpu=8, used_cpu=8)]
    queues = [queue("a"), queue("b")]
    # b holds 6 and deserves 4: at most 2 cores can come back to a, which needs 3.
    rich = running_job("rich", pods=6, minimum=1, priority=1, queue_name="b")
    mine = running_job("mine", pods=2, minimum=2, priority=1, queue_name="a")
    wants = gang("wants", workers=2, priority=1, queue="a")
    plan = run_cycle(snapshot(nodes, [rich, mine, wants], queues=queues))
    assert plan.evictions == []
    smaller = gang("smaller", workers=1, priority=1, queue="a")  # 2 cores: b can spare them
    plan = run_cycle(snapshot(nodes, [rich, mine, smaller], queues=queues))
    assert evicted(plan) == ["rich-4", "rich-5"]


def test_a_job_missing_a_minimum_worker_has_no_surplus_to_give() -> None:
    # v's in-minimum worker w0 is pending (its node was lost); w1-w3 run. Its minimum is the
    # leader and 2 workers, so only 1 worker is spare; taking 2 would cut it below minimum.
    v = JobInfo(
        id="v",
        name="v",
        queue="default",
        priority=3,
        submit_time=0.0,
        pending=(PodRequest("v-w0", Role.WORKER, 0, CORE, GI),),
        running=(
            RunningPod(
                "v-l", "n", Res(CORE, GI, 0), role=Role.LEADER, in_minimum=True, start_time=1
            ),
            RunningPod("v-w1", "n", Res(CORE, GI, 0), in_minimum=True, start_time=1),
            RunningPod("v-w2", "n", Res(CORE, GI, 0), in_minimum=False, start_time=2),
            RunningPod("v-w3", "n", Res(CORE, GI, 0), in_minimum=False, start_time=3),
        ),
        allocated=Res(4 * CORE, 4 * GI, 0),
        start_time=1.0,
    )
    plan = run_cycle(
        snapshot([node("n", cpu=4, used_cpu=4)], [v, gang("p", workers=0, cpu=2, priority=9)])
    )
    assert evicted(plan) == ["v-l", "v-w1", "v-w2", "v-w3"]  # one spare is not enough: all of it


def test_a_job_evicted_whole_starts_again_only_once_all_of_it_has_stopped() -> None:
    # Its leader has stopped and waits to be placed; two of its minimum workers still stop.
    job = JobInfo(
        id="back",
        name="back",
        queue="default",
        priority=3,
        submit_time=0.0,
        pending=(
            PodRequest("back-l", Role.LEADER, -1, CORE, GI),
            PodRequest("back-w0", Role.WORKER, 0, CORE, GI),
        ),
        running=(
            RunningPod("back-w1", "n", Res(CORE, GI, 0), terminating=True),
            RunningPod("back-w2", "n", Res(CORE, GI, 0), terminating=True),
        ),
        allocated=Res(2 * CORE, 2 * GI, 0),
    )
    plan = run_cycle(snapshot([node("n", cpu=8, used_cpu=2)], [job]))
    assert plan.placements == []
    assert plan.decisions["back"].message.startswith("waiting for 2 of its pods to stop")
