"""reserve: one more node locked each cycle until the starving job's minimum would fit."""

from __future__ import annotations

import dataclasses

from arranger.sched import Plan, SchedulerConfig, Snapshot, run_cycle
from arranger.sched.plan import Reservation
from arranger.sched.snapshot import JobInfo
from tests.sched.builders import gang, job_of, node, pod, queue, snapshot
from tests.sched.test_preemption import running_job

NO_EVICTION = SchedulerConfig(
    actions=("enqueue", "allocate", "backfill", "reserve"), starvation_threshold_s=10
)


def busy_cluster() -> tuple[list, list[JobInfo]]:  # type: ignore[type-arg]
    nodes = [node(n, cpu=4, used_cpu=4) for n in "abcd"]
    fillers = [running_job(f"f{n}", pods=4, minimum=4, priority=5, node_name=n) for n in "abcd"]
    return nodes, fillers


def starving(job_id: str, workers: int, priority: int = 5, since: float = 0.0) -> JobInfo:
    return dataclasses.replace(
        gang(job_id, workers=workers, cpu=1, priority=priority), waiting_since=since
    )


def cycles(snap: Snapshot, count: int) -> list[Plan]:
    plans = []
    for _ in range(count):
        plan = run_cycle(snap, NO_EVICTION)
        plans.append(plan)
        snap = dataclasses.replace(snap, reservation=plan.reservation, now=snap.now + 1)
    return plans


def test_one_node_more_each_cycle_until_the_minimum_would_fit_then_no_more() -> None:
    nodes, fillers = busy_cluster()
    big = starving("big", workers=7)  # 8 cores: two nodes once drained
    plans = cycles(snapshot(nodes, [*fillers, big], now=100), 4)
    held = [p.reservation.nodes if p.reservation else () for p in plans]
    assert held == [("a",), ("a", "b"), ("a", "b"), ("a", "b")]
    assert plans[-1].decisions["big"].reason == "Reserving"
    assert plans[-1].decisions["big"].message.startswith("2 nodes reserved for it (a, b)")


def test_not_before_the_threshold_and_never_for_a_job_that_could_not_fit_anyway() -> None:
    nodes, fillers = busy_cluster()
    assert (
        run_cycle(
            snapshot(nodes, [*fillers, starving("new", 7, since=95)], now=100), NO_EVICTION
        ).reservation
        is None
    )
    huge = starving("huge", workers=20)  # 21 cores on 16: locking would only starve the rest
    assert run_cycle(snapshot(nodes, [*fillers, huge], now=100), NO_EVICTION).reservation is None


def test_a_job_held_back_by_its_queue_gets_no_reservation() -> None:
    nodes, fillers = busy_cluster()
    capped = dataclasses.replace(starving("capped", workers=1), queue="q")
    snap = snapshot(nodes, [*fillers, capped], now=100, queues=[queue("q", cpu=1)])
    assert run_cycle(snap, NO_EVICTION).reservation is None


def test_the_target_keeps_its_reservation_when_a_more_urgent_job_starves_too() -> None:
    nodes, fillers = busy_cluster()
    first = starving("first", workers=3, priority=3)
    plans = cycles(snapshot(nodes, [*fillers, first], now=100), 1)
    assert plans[0].reservation is not None and plans[0].reservation.job_id == "first"
    urgent = starving("urgent", workers=3, priority=9)
    snap = snapshot(nodes, [*fillers, first, urgent], now=101)
    snap = dataclasses.replace(snap, reservation=plans[0].reservation)
    assert run_cycle(snap, NO_EVICTION).reservation.job_id == "first"  # type: ignore[union-attr]


def test_other_jobs_keep_the_nodes_that_are_not_locked() -> None:
    nodes = [
        node("a", cpu=4, used_cpu=4),
        node("b", cpu=4, used_cpu=4),
        node("c", cpu=4),
        node("d", cpu=4),
    ]
    fillers = [running_job(f"f{n}", pods=4, minimum=4, priority=5, node_name=n) for n in "ab"]
    big = starving("big", workers=9)  # 10 cores: three nodes once drained
    snap = snapshot(nodes, [*fillers, big], now=100)
    first = run_cycle(snap, NO_EVICTION)
    assert first.reservation is not None and first.reservation.nodes == ("c",)
    later = gang("later", workers=1, cpu=1)
    plan = run_cycle(
        dataclasses.replace(snap, jobs=(*fillers, big, later), reservation=first.reservation),
        NO_EVICTION,
    )
    assert {p.node for p in plan.placements if p.job_id == "later"} == {"d"}  # not locked c


def test_the_plan_says_when_time_alone_could_change_it() -> None:
    """wake_at: the starvation threshold of a waiting job, then each cycle while a reservation
    grows, and nothing once every decision waits only for the cluster to change."""
    config = SchedulerConfig(starvation_threshold_s=100.0)
    nodes = (node("n1", cpu=4, used_cpu=3), node("n2", cpu=4, used_cpu=3))
    hogs = (
        running_job("hog1", 3, 3, priority=5, node_name="n1"),
        running_job("hog2", 3, 3, priority=5, node_name="n2"),
    )
    wide = dataclasses.replace(
        job_of("wide", pod("wide-l", cpu=3, leader=True), pod("wide-w", cpu=3), priority=1),
        waiting_since=10.0,
    )

    def cycle(now: float, reservation: Reservation | None = None) -> Plan:
        return run_cycle(Snapshot(now, nodes, (*hogs, wide), reservation=reservation), config)

    plan = cycle(50.0)
    assert plan.placements == [] and plan.wake_at == 110.0  # it starves from then on
    plan = cycle(110.0)
    assert plan.reservation is not None and len(plan.reservation.nodes) == 1
    assert plan.wake_at == 110.0  # a node was locked: the next cycle may lock the next one
    plan = cycle(111.0, plan.reservation)
    assert plan.reservation is not None and len(plan.reservation.nodes) == 2
    assert plan.wake_at == 111.0
    # Locked enough: it waits for the hogs to end, which is a change of the cluster.
    assert cycle(112.0, plan.reservation).wake_at is None
