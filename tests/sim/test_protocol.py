"""The paper's protocol: arrival order, inflation, and the arrived/allocated bookkeeping."""

from __future__ import annotations

from fractions import Fraction

import pytest

from arranger.sched.snapshot import PodRequest
from arranger.sim.protocol import POINTS, arrivals, policy, simulate
from arranger.sim.trace import Trace
from arranger.states import BasicPolicy
from tests.sim import node, pod

CAPACITY = 4000  # four GPUs


def mixed_pods() -> list[PodRequest]:
    return [pod(f"p{i:02d}", gpu=g) for i, g in enumerate([1, 0.5, 0, 2, 0.25, 1, 0, 0.5, 1, 0.75])]


def gpus(pods: list[PodRequest]) -> int:
    return sum(p.gpu_milli for p in pods)


@pytest.mark.parametrize("inflate", [1.3, 1.0, 2.5])
def test_inflation_reaches_the_target_and_stops_at_the_pod_that_reaches_it(inflate: float) -> None:
    pods = mixed_pods()  # 7 GPUs asked in all: 1.75 x capacity
    order = arrivals(pods, seed=42, inflate=inflate, capacity_milli=CAPACITY)
    target = Fraction(str(inflate)) * CAPACITY
    assert gpus(order) >= target
    assert gpus(order[:-1]) < target  # no more than one pod past it
    assert order[-1].gpu_milli > 0  # a CPU-only pod cannot be the one that reaches it


def test_the_trace_comes_first_then_draws_from_it_with_new_names() -> None:
    pods = mixed_pods()
    order = arrivals(pods, seed=7, inflate=2.5, capacity_milli=CAPACITY)  # 10 GPUs: 3 to draw
    assert sorted(p.name for p in order[: len(pods)]) == sorted(p.name for p in pods)
    extra = order[len(pods) :]
    assert extra
    originals = {p.name: p for p in pods}
    for n, drawn in enumerate(extra, start=1):
        base, suffix = drawn.name.rsplit("-x", 1)
        assert suffix == str(n)
        assert drawn.request == originals[base].request  # the same pod, drawn again
    assert len({p.name for p in order}) == len(order)


def test_the_shuffle_is_seeded_and_ignores_the_file_order() -> None:
    pods = mixed_pods()
    first = [p.name for p in arrivals(pods, 42, 1.3, CAPACITY)]
    assert first == [p.name for p in arrivals(list(reversed(pods)), 42, 1.3, CAPACITY)]
    assert first != [p.name for p in arrivals(pods, 43, 1.3, CAPACITY)]


def test_no_gpu_request_means_no_inflation() -> None:
    pods = [pod(f"c{i}", cpu=1) for i in range(3)]
    assert len(arrivals(pods, 1, 1.3, CAPACITY)) == 3


def test_arrived_counts_dropped_pods_and_allocated_counts_placed_ones() -> None:
    # Two nodes of one GPU and 2 cores; every pod asks for 2 cores and half a GPU, so each
    # node takes one pod and strands the other half of its GPU: arrivals go 25 %, 50 %
    # (both placed), 75 %, 100 %, 125 %, 150 % (all dropped: no CPU left).
    nodes = (node("a", cpu=2, gpus=1), node("b", cpu=2, gpus=1))
    pods = tuple(pod(f"q{i}", cpu=2, gpu=0.5) for i in range(8))
    result = simulate(Trace("t", "n", nodes, pods), "BestFit", seed=1)
    assert (result.arrived, result.placed, result.dropped) == (6, 2, 4)
    assert result.unallocated == {str(p): 50.0 for p in POINTS}
    # The mix is this one class, which fits no node (no CPU left): all free GPU is fragment.
    assert result.fragmentation == {str(p): 100.0 for p in POINTS}
    assert [x for x, _ in result.curve][:3] == [1.0, 2.0, 3.0]
    assert dict(result.curve)[30.0] == 50.0  # the 2nd pod: 50 % arrived, 1 of 2 GPUs placed


def test_points_never_reached_are_null() -> None:
    nodes = (node("a", gpus=4),)
    pods = tuple(pod(f"g{i}", gpu=1) for i in range(4))
    result = simulate(Trace("t", "n", nodes, pods), "MinFragment", seed=1, inflate=1.0)
    assert result.unallocated["100"] == 0.0
    assert result.unallocated["110"] is None and result.fragmentation["130"] is None


def test_gpu_spec_restricts_models_so_a_pod_without_its_model_is_dropped() -> None:
    nodes = (node("a", gpus=2, model="T4"),)
    pods = (pod("v", gpu=1, gpu_type="V100M16|V100M32"), pod("t", gpu=1, gpu_type="T4"))
    result = simulate(Trace("t", "n", nodes, pods), "FGD", seed=3, inflate=1.0)
    assert (result.placed, result.dropped) == (1, 1)


def test_policy_names() -> None:
    assert policy("fgd").plugin == policy("sim-fgd").plugin == "sim-fgd"
    assert (policy("minfragment").plugin, policy("MinFragment").basic) == (
        "minfragment",
        BasicPolicy.MIN_FRAGMENT,
    )
    with pytest.raises(ValueError, match="known: Random"):
        policy("Tetris")
