"""Each published baseline on small hand-made clusters: where a pod goes, and why it must."""

from __future__ import annotations

import pytest

from arranger.sched.nodes import NodeArrays
from arranger.sim.policies import best_fit_gpus
from tests.sim import MIX_PODS, TINY, node, pod, put, session


def test_random_takes_any_feasible_node_and_only_those() -> None:
    nodes = [
        node("a", cpu=4, gpus=1),
        node("b", cpu=2, gpus=1),  # too few cores for the pod
        node("c", cpu=64, gpus=8),
    ]
    chosen = [put(session(nodes, "sim-random", seed), pod("p", cpu=4, gpu=1)) for seed in range(40)]
    assert {c[0] for c in chosen if c} == {"a", "c"}
    # The seed decides, and only the seed.
    again = [put(session(nodes, "sim-random", seed), pod("p", cpu=4, gpu=1)) for seed in range(40)]
    assert again == chosen


def test_random_puts_a_share_on_any_gpu_with_room() -> None:
    nodes = [node("a", gpus=4, used=[0, 600, 900, 1000])]  # room: 1000, 400, 100, 0
    chosen = {put(session(nodes, "sim-random", seed), pod("s", gpu=0.3)) for seed in range(40)}
    assert chosen == {("a", (0,)), ("a", (1,))}


def test_dotprod_takes_the_node_whose_free_resources_align_least_with_the_request() -> None:
    # 4 cores + 1 GPU: on "small" (8 cores, 1 GPU free) the dot product of the normalised free
    # and requested vectors is 0.0625 * 0.03125 + 0.125 * 0.125 = 0.0176 (score 99); on "big"
    # (64 cores, 8 GPUs) 0.5 * 0.03125 + 1 * 0.125 = 0.14 (score 92).
    sim = session([node("big", cpu=64, gpus=8), node("small", cpu=8, gpus=1)], "sim-dotprod")
    assert put(sim, pod("p", cpu=4, gpu=1)) == ("small", (0,))


def test_gpu_packing_fills_used_gpus_then_used_nodes_then_small_idle_nodes() -> None:
    nodes = [
        node("idle8", gpus=8),
        node("idle2", gpus=2),
        node("used", gpus=4, used=[1000]),
        node("shared", gpus=2, used=[600, 1000]),
    ]
    sim = session(nodes, "sim-gpupacking")
    # A share goes to a partially used GPU (the only one with room for it: 400 free).
    assert put(sim, pod("s", gpu=0.3)) == ("shared", (0,))
    # Whole GPUs: the free ones of a used node before any idle node.
    assert put(sim, pod("w1", gpu=1)) == ("used", (1,))
    assert put(sim, pod("w2", gpu=2)) == ("used", (2, 3))
    # No used node has a free GPU left: the idle node with fewer GPUs (33 - 2 > 33 - 8).
    assert put(sim, pod("w3", gpu=2)) == ("idle2", (0, 1))


def test_gpu_packing_cpu_only_pods_tie_everywhere_and_follow_one_order_for_the_run() -> None:
    nodes = [node(f"n{i}", cpu=64, gpus=2) for i in range(6)]
    for seed in range(3):
        sim = session(nodes, "sim-gpupacking", seed)
        where = {put(sim, pod(f"c{i}", cpu=4)) for i in range(5)}
        assert len(where) == 1  # the same node each time: the run's order breaks the tie


def test_best_fit_takes_the_node_with_the_least_left_over() -> None:
    # 4 cores + 1 GPU leaves 0.5 * cores/128 + 0.5 * GPUs/8: "roomy" 0.67 (score 32), "snug"
    # (8 cores, 2 GPUs) 0.078 (92), "tight" (6 cores, 1 GPU) 0.008 (99).
    nodes = [
        node("roomy", cpu=64, gpus=8),
        node("snug", cpu=8, gpus=2),
        node("tight", cpu=6, gpus=1),
    ]
    sim = session(nodes, "sim-bestfit")
    assert put(sim, pod("p1", cpu=4, gpu=1)) == ("tight", (0,))
    assert put(sim, pod("p2", cpu=4, gpu=1)) == ("snug", (0,))  # tight has no GPU left


def test_fgd_places_a_share_where_the_expected_fragmentation_drops_most() -> None:
    # On TINY (GPUs free 1000, 1000, 500, 200) 300 milli on GPU 0 lowers F by 150 (score 53);
    # on GPU 2 by only 50 (51): the 200 it would leave is useless to the half-GPU class. Best
    # fit would take GPU 2. On the fresh node F would grow by 100 (47).
    sim = session([node("fresh", gpus=4), TINY], "sim-fgd", mix=MIX_PODS)
    assert put(sim, pod("s", cpu=1, gpu=0.3)) == ("tiny", (0,))


def test_fgd_sends_a_cpu_heavy_pod_where_it_strands_no_gpu() -> None:
    # 20 of "fresh"'s 32 cores would leave too few for the 16-core GPU class: a quarter of its
    # 4000 free milli-GPUs become fragment (score 26). "full" has no GPU free to strand (50).
    nodes = [node("fresh", gpus=4), node("full", cpu=32, gpus=2, used=[1000, 1000])]
    assert put(session(nodes, "sim-fgd", mix=MIX_PODS), pod("c", cpu=20)) == ("full", ())


@pytest.mark.parametrize("plugin", ["sim-dotprod", "sim-gpupacking", "sim-bestfit"])
def test_the_others_put_a_share_on_the_gpu_with_the_least_room_that_fits(plugin: str) -> None:
    sim = session([node("a", gpus=3, used=[0, 600, 300])], plugin)  # room 1000, 400, 700
    assert put(sim, pod("s", gpu=0.3)) == ("a", (1,))


def test_best_fit_gpus_whole_gpus_are_the_lowest_numbered_free_ones() -> None:
    arrays = NodeArrays((node("a", gpus=4, used=[0, 500]),))
    assert [g.index for g in best_fit_gpus(arrays, 0, pod("w", gpu=2)) or ()] == [0, 2]
    assert best_fit_gpus(arrays, 0, pod("w", gpu=4)) is None
