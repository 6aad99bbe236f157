"""explain: why a job waits, on small snapshots."""

from __future__ import annotations

import dataclasses

from arranger.sched import SchedulerConfig
from arranger.sched.explain import explain
from arranger.sched.plan import Reservation
from tests.sched.builders import gang, node, snapshot
from tests.sched.test_preemption import running_job


def test_a_blocked_job_gets_its_turn_fits_victims_and_an_estimated_start() -> None:
    nodes = [node("a", cpu=8, used_cpu=8), node("b", cpu=8, used_cpu=8, labels={"zone": "x"})]
    low = dataclasses.replace(
        running_job("low", pods=8, minimum=2, priority=3, started=100, node_name="a"),
        max_runtime_s=60,
    )
    other = dataclasses.replace(
        running_job("other", pods=8, minimum=8, priority=9, started=50, node_name="b"),
        max_runtime_s=600,
    )
    first = gang("first", workers=1, priority=9, submit_time=1)
    mine = gang("mine", workers=2, priority=6, submit_time=2)
    found = explain(snapshot(nodes, [low, other, first, mine], now=120), SchedulerConfig(), "mine")
    assert found is not None and not found.placed
    assert (found.position, found.waiting_in_queue) == (2, 2)  # behind the priority-9 job
    assert [(f.pod, f.count, f.fitting_nodes, f.reasons) for f in found.fits] == [
        ("mine-l", 1, 0, (("insufficient cpu", 2),)),
        ("mine-w0", 2, 0, (("insufficient cpu", 2),)),
    ]
    assert [(v.job, v.pods) for v in found.preemptable] == [("low", 3)]  # not the priority-9 job
    assert found.preemptable[0].why == "frees 3 cpu, 3Gi memory on a, where the minimum's pods go"
    assert found.refused == []  # room is being made for it: nothing was refused
    assert found.estimated_start == 160.0  # low reaches its maxRuntimeSeconds at 100 + 60
    assert found.queue_allocated.cpu_milli == 16000


def test_a_job_nothing_is_evicted_for_says_why() -> None:
    nodes = [node("a", cpu=8, used_cpu=8)]
    other = running_job("other", pods=8, minimum=8, priority=9, node_name="a")
    found = explain(snapshot(nodes, [other, gang("mine", workers=1)]), SchedulerConfig(), "mine")
    assert found is not None and found.preemptable == []
    assert [(r.action, r.reason, r.message) for r in found.refused] == [
        ("preempt", "VictimNotLowerPriority", "1 running jobs not of lower priority"),
        ("reclaim", "QueueNotBelowShare", "its queue is not below its deserved share"),
    ]


def test_reservations_are_named_from_both_sides() -> None:
    nodes = [node("a", cpu=8, used_cpu=8), node("b", cpu=8)]
    starving, other = gang("starving", workers=8, priority=5), gang("other", workers=0)
    snap = dataclasses.replace(
        snapshot(nodes, [starving, other]), reservation=Reservation("starving", ("b",))
    )
    assert explain(snap, SchedulerConfig(), "starving").reservation == (  # type: ignore[union-attr]
        "holds a reservation of 1 nodes against starvation"
    )
    found = explain(snap, SchedulerConfig(), "other")
    assert (
        found is not None
        and found.reservation
        == "1 nodes are reserved for starving job starving; it cannot use them"
    )
    assert found.fits[0].reasons == (("reserved for a starving job", 1), ("insufficient cpu", 1))


def test_a_job_not_in_the_snapshot_has_no_explanation() -> None:
    assert explain(snapshot([node("a")], []), SchedulerConfig(), "gone") is None


def test_the_jobs_ahead_are_named_in_scheduling_order_the_first_five() -> None:
    nodes = [node("a", cpu=8, used_cpu=8)]
    waiting = [gang(f"j{p}", workers=1, priority=p, submit_time=10 - p) for p in range(2, 10)]
    mine = gang("mine", workers=1, priority=1, submit_time=20)
    other_queue = gang("elsewhere", workers=1, priority=10, queue="other")
    found = explain(snapshot(nodes, [*waiting, mine, other_queue]), SchedulerConfig(), "mine")
    assert found is not None and found.position == 9
    assert found.ahead == ["j9", "j8", "j7", "j6", "j5"] and found.ahead_more == 3
    first = explain(snapshot(nodes, [*waiting, mine]), SchedulerConfig(), "j9")
    assert first is not None and first.ahead == [] and first.ahead_more == 0


def test_a_pod_has_one_count_in_the_fits_and_in_the_cycles_message() -> None:
    """The leader takes the one node a worker would fit on: the worker's row counts the nodes
    with the leader placed, as the cycle's message does (not 1/2 beside 0/2)."""
    nodes = [node("a", cpu=8), node("b", cpu=4)]
    found = explain(snapshot(nodes, [gang("mine", workers=1, cpu=5)]), SchedulerConfig(), "mine")
    assert found is not None and not found.placed
    assert "0/2 nodes fit pod mine-w0" in found.message
    assert [(f.pod, f.fitting_nodes, f.reasons) for f in found.fits] == [
        ("mine-l", 1, (("insufficient cpu", 1),)),
        ("mine-w0", 0, (("insufficient cpu", 2),)),
    ]
    assert all(
        f.fitting_nodes + sum(n for _, n in f.reasons) == f.total_nodes == 2 for f in found.fits
    )
