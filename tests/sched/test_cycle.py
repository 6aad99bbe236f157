"""The scheduling core, driven with small snapshots: no server, no I/O."""

from __future__ import annotations

from collections import Counter

from arranger.sched import Plan, SchedulerConfig, run_cycle
from arranger.states import ScheduleState
from tests.sched.builders import gang, job_of, node, pod, snapshot


def placed_nodes(plan: Plan, job_id: str) -> Counter[str]:
    return Counter(p.node for p in plan.placements if p.job_id == job_id)


def test_gang_minimum_is_all_or_nothing() -> None:
    # 2 nodes x 4 cores with 2 used on each; the minimum needs 1 + 4 cores: nothing is placed.
    nodes = [node("a", cpu=4, used_cpu=2), node("b", cpu=4, used_cpu=2)]
    plan = run_cycle(snapshot(nodes, [gang("j", workers=4)]))
    assert plan.placements == []
    decision = plan.decisions["j"]
    assert decision.state == ScheduleState.UNSCHEDULED and not decision.infeasible
    assert decision.message == (
        "0/2 nodes fit pod j-w3 of the gang minimum: 2 insufficient cpu"
        "; preempt and reclaim refused (NoPreemptionVictims): no other job is running"
    )


def test_a_minimum_larger_than_the_cluster_is_infeasible() -> None:
    decision = run_cycle(
        snapshot([node("a", cpu=4), node("b", cpu=4)], [gang("j", workers=8)])
    ).decisions["j"]
    assert decision.infeasible and decision.message.endswith(
        "it needs more cpu than the whole cluster has (2 ready nodes)"
    )


def test_extra_workers_are_placed_when_they_fit_and_the_job_is_partly_scheduled() -> None:
    # Minimum: leader + 2 workers; 6 more workers are extras. 7 cores in all.
    job = gang("j", workers=8, minimum=2)
    plan = run_cycle(snapshot([node("a", cpu=4), node("b", cpu=3)], [job]))
    assert len(plan.placements) == 7
    assert {p.pod for p in plan.placements} >= {"j-l", "j-w0", "j-w1"}
    decision = plan.decisions["j"]
    assert decision.state == ScheduleState.SCHEDULED_PARTLY
    assert decision.message.startswith(
        "2 pods above the minimum wait for resources: 0/2 nodes fit pod j-w6"
    )


def test_binpack_fills_the_busiest_node_first_and_ties_go_to_the_first_name() -> None:
    nodes = [node("a", cpu=8), node("b", cpu=8, used_cpu=4), node("c", cpu=8, used_cpu=4)]
    plan = run_cycle(snapshot(nodes, [gang("j", workers=1)]))
    assert {p.node for p in plan.placements} == {"b"}


def test_higher_priority_job_is_placed_first_when_only_one_fits() -> None:
    low = gang("low", workers=3, priority=3, submit_time=1)
    high = gang("high", workers=3, priority=8, submit_time=2)
    plan = run_cycle(snapshot([node("a", cpu=4)], [low, high]))
    assert placed_nodes(plan, "high") == Counter({"a": 4})
    assert plan.decisions["low"].state == ScheduleState.UNSCHEDULED


def test_equal_priority_goes_by_submit_time() -> None:
    first = gang("first", workers=3, submit_time=1)
    second = gang("second", workers=3, submit_time=2)
    plan = run_cycle(snapshot([node("a", cpu=4)], [second, first]))
    assert placed_nodes(plan, "first") and not placed_nodes(plan, "second")


def test_two_big_gangs_do_not_deadlock_one_runs() -> None:
    # Each gang needs 6 of 8 cores across 2 nodes; placing them pod by pod interleaved would
    # strand both. Gangs are placed whole in order: the first runs, the second waits.
    nodes = [node("a", cpu=4), node("b", cpu=4)]
    plan = run_cycle(
        snapshot(nodes, [gang("x", workers=5, submit_time=1), gang("y", workers=5, submit_time=2)])
    )
    assert sum(placed_nodes(plan, "x").values()) == 6
    assert sum(placed_nodes(plan, "y").values()) == 0


def test_whole_gpus_go_to_free_devices_and_type_is_a_hard_filter() -> None:
    nodes = [
        node("a", gpus=4, model="V100"),
        node("b", gpus=4, model="A100", gpu_used=[1000, 0, 0, 0]),
    ]
    job = gang("j", workers=1, gpu=2)
    plan = run_cycle(snapshot(nodes, [job]))
    # BinPack with GPUs weighted most prefers the busier GPU node b, whose GPU 0 is taken.
    by_pod = {p.pod: p for p in plan.placements}
    assert by_pod["j-l"].node == "b" and [g.index for g in by_pod["j-l"].gpus] == [1, 2]
    typed = run_cycle(
        snapshot(nodes, [job_of("t", pod("t-l", leader=True, gpu=1, gpu_type="V100"))])
    )
    assert typed.placements[0].node == "a"
    wrong = run_cycle(
        snapshot(nodes, [job_of("w", pod("w-l", leader=True, gpu=1, gpu_type="H100"))])
    )
    assert "2 gpuType H100 wanted" in wrong.decisions["w"].message


def test_gpu_fractions_share_one_gpu_up_to_a_whole() -> None:
    pods = [pod(f"p{i}", cpu=0.1, gpu=0.25, rank=i) for i in range(5)]
    job = job_of("j", pod("j-l", cpu=0.1, leader=True), *pods)
    plan = run_cycle(snapshot([node("a", gpus=2)], [job]))
    shares: Counter[int] = Counter()
    for p in plan.placements:
        for g in p.gpus:
            shares[g.index] += g.milli
    assert shares == Counter({0: 1000, 1: 250})


def test_node_selector_and_unschedulable_nodes_are_reasons() -> None:
    nodes = [
        node("a", labels={"zone": "x"}),
        node("b", schedulable=False, labels={"zone": "z"}),  # cordoned: it will be back
        node("c", labels={"zone": "y"}),
    ]
    job = job_of("j", pod("j-l", leader=True, selector={"zone": "z"}))
    decision = run_cycle(snapshot(nodes, [job])).decisions["j"]
    assert not decision.infeasible
    assert (
        decision.message
        == "0/3 nodes fit pod j-l of the gang minimum: 1 not ready or cordoned, 2 nodeSelector mismatch"
        "; preempt and reclaim refused (NoPreemptionVictims): no other job is running"
    )
    gone = run_cycle(snapshot([nodes[0], nodes[2]], [job])).decisions["j"]
    assert gone.infeasible and gone.message.endswith("2 nodeSelector mismatch")


def test_a_job_that_cannot_fit_the_empty_cluster_fails_after_the_timeout() -> None:
    config = SchedulerConfig(infeasible_timeout_s=60)
    big = gang("j", workers=20)
    first = run_cycle(snapshot([node("a", cpu=4)], [big], now=100), config).decisions["j"]
    assert first.state == ScheduleState.UNSCHEDULED and first.infeasible
    later = gang("j", workers=20, infeasible_since=100)
    assert (
        run_cycle(snapshot([node("a", cpu=4)], [later], now=159), config).decisions["j"].state
        == ScheduleState.UNSCHEDULED
    )
    final = run_cycle(snapshot([node("a", cpu=4)], [later], now=160), config).decisions["j"]
    assert final.state == ScheduleState.SCHEDULED_FAILED
    assert "cannot fit even the empty cluster" in final.message


def test_a_job_blocked_only_by_load_is_not_infeasible() -> None:
    decision = run_cycle(
        snapshot([node("a", cpu=4, used_cpu=4)], [gang("j", workers=1)])
    ).decisions["j"]
    assert decision.state == ScheduleState.UNSCHEDULED and not decision.infeasible


def test_whole_gpu_pods_never_take_a_shared_gpu() -> None:
    shared = node("a", gpus=2, gpu_used=[250, 0])
    one = run_cycle(snapshot([shared], [job_of("one", pod("one-l", leader=True, gpu=1))]))
    assert [g.index for g in one.placements[0].gpus] == [1]
    two = run_cycle(snapshot([shared], [job_of("two", pod("two-l", leader=True, gpu=2))]))
    assert two.placements == [] and "1 insufficient gpu" in two.decisions["two"].message
