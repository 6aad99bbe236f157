"""Each basicPolicy's score, driven with small snapshots, asserting where pods land."""

from __future__ import annotations

from collections import Counter

from arranger.sched import Plan, run_cycle
from arranger.states import BasicPolicy
from tests.sched.builders import gang, job_of, node, pod, snapshot


def where(plan: Plan) -> dict[str, str]:
    return {p.pod: p.node for p in plan.placements}


def test_leader_first_puts_the_leader_on_the_idlest_node_and_workers_on_the_busiest() -> None:
    nodes = [node("a", cpu=8, used_cpu=6), node("b", cpu=8), node("c", cpu=8, used_cpu=3)]
    plan = run_cycle(snapshot(nodes, [gang("j", workers=2, policy=BasicPolicy.LEADER_FIRST)]))
    assert where(plan) == {"j-l": "b", "j-w0": "a", "j-w1": "a"}


def test_binpack_would_put_the_same_leader_on_the_busiest_node() -> None:
    nodes = [node("a", cpu=8, used_cpu=6), node("b", cpu=8), node("c", cpu=8, used_cpu=3)]
    plan = run_cycle(snapshot(nodes, [gang("j", workers=2)]))
    assert where(plan)["j-l"] == "a"


def test_min_fragment_keeps_cpu_and_memory_balanced() -> None:
    # x would be fuller (BinPack's pick) but left with its CPU gone and its memory idle.
    nodes = [node("x", cpu=8, memory_gi=32, used_cpu=6), node("y", cpu=8, memory_gi=32, used_cpu=1)]
    nodes[0] = nodes[0].__class__(**{**_fields(nodes[0]), "used_memory_bytes": 2 * 2**30})
    nodes[1] = nodes[1].__class__(**{**_fields(nodes[1]), "used_memory_bytes": 8 * 2**30})
    job = gang("j", workers=0, cpu=2, memory_gi=2, policy=BasicPolicy.MIN_FRAGMENT)
    assert where(run_cycle(snapshot(nodes, [job]))) == {"j-l": "y"}
    binpack = gang("j", workers=0, cpu=2, memory_gi=2)
    assert where(run_cycle(snapshot(nodes, [binpack]))) == {"j-l": "x"}


def test_min_fragment_does_not_strand_gpus_behind_used_cpus() -> None:
    nodes = [node("a-gpu", cpu=8, gpus=4, used_cpu=6), node("b-cpu", cpu=8, used_cpu=6)]
    cpu_only = gang("j", workers=0, cpu=2, policy=BasicPolicy.MIN_FRAGMENT)
    assert where(run_cycle(snapshot(nodes, [cpu_only]))) == {"j-l": "b-cpu"}
    assert where(run_cycle(snapshot(nodes, [gang("k", workers=0, cpu=2)]))) == {"k-l": "a-gpu"}


def test_job_affinity_packs_pods_with_the_ones_already_running() -> None:
    nodes = [node("a"), node("b"), node("c")]
    job = gang("j", workers=2, policy=BasicPolicy.JOB_AFFINITY, bound={"j-old": "b"})
    assert set(where(run_cycle(snapshot(nodes, [job]))).values()) == {"b"}
    fresh = gang("k", workers=3, policy=BasicPolicy.JOB_AFFINITY)
    assert len(set(where(run_cycle(snapshot(nodes, [fresh]))).values())) == 1


def test_job_anti_affinity_spreads_pods() -> None:
    nodes = [node("a"), node("b"), node("c")]
    job = gang("j", workers=2, policy=BasicPolicy.JOB_ANTI_AFFINITY)
    assert sorted(where(run_cycle(snapshot(nodes, [job]))).values()) == ["a", "b", "c"]
    crowded = gang("k", workers=5, policy=BasicPolicy.JOB_ANTI_AFFINITY)
    assert sorted(Counter(where(run_cycle(snapshot(nodes, [crowded]))).values()).values()) == [
        2,
        2,
        2,
    ]


def test_preferred_gpu_type_wins_a_tie_but_is_not_required() -> None:
    nodes = [node("a", gpus=4, model="V100"), node("b", gpus=4, model="A100")]
    prefers = job_of("j", pod("j-l", leader=True, gpu=1, preferred="A100"))
    assert where(run_cycle(snapshot(nodes, [prefers]))) == {"j-l": "b"}
    busy_b = [nodes[0], node("b", gpus=4, model="A100", gpu_used=[1000] * 4)]
    assert where(run_cycle(snapshot(busy_b, [prefers]))) == {"j-l": "a"}


def test_gang_policy_places_every_pod_or_none() -> None:
    nodes = [node("a", cpu=2)]
    elastic = gang("e", workers=3, minimum=0)
    assert len(run_cycle(snapshot(nodes, [elastic])).placements) == 2  # the leader and one extra
    whole = gang("g", workers=3, minimum=0, policy=BasicPolicy.GANG)
    decision = run_cycle(snapshot(nodes, [whole]))
    assert decision.placements == [] and decision.decisions["g"].message.endswith(
        "whole cluster has (1 ready node)"
    )


def _fields(info):  # type: ignore[no-untyped-def]
    return {name: getattr(info, name) for name in info.__slots__}
