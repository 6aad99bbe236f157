"""FGD's fragmentation measure, against numbers worked out by hand."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from arranger.sched.fragmentation import (
    Fragmentation,
    RequestClass,
    fragmentation_rate,
    request_class,
    request_mix,
)
from arranger.sched.nodes import Allocation, NodeArrays
from arranger.sched.plan import GpuShare
from arranger.sched.snapshot import NodeInfo, PodRequest
from tests.sim import MIX_PODS, TINY, node, pod

MIX = request_mix(MIX_PODS)


def test_request_mix_keeps_the_most_frequent_classes_up_to_the_coverage() -> None:
    assert MIX.classes == (
        RequestClass(4000, 500, 1, ""),
        RequestClass(16000, 1000, 1, ""),
        RequestClass(1000, 0, 0, ""),
    )
    assert MIX.popularity == (0.5, 0.25, 0.25)
    # 2 + 1 of 4 pods is 75 %: a coverage of 0.7 stops there and renormalises.
    short = request_mix(MIX_PODS, 0.7)
    assert short.popularity == (2 / 3, 1 / 3)


def test_request_class_of_whole_gpus_and_models() -> None:
    assert request_class(pod("x", cpu=2, gpu=4, gpu_type="B|A")) == RequestClass(
        2000, 1000, 4, "A|B"
    )


def test_a_tiny_node_by_hand() -> None:
    # A fits (8 >= 4 cores, three GPUs with >= 500 free): only the 200 below 500 is fragment.
    # B lacks cores (16 > 8): all 2700 free is fragment to it. C is CPU-only: 2700.
    # F = 0.5 * 200 + 0.25 * 2700 + 0.25 * 2700 = 1450.
    frag = Fragmentation(NodeArrays((TINY,)), MIX)
    assert frag.values(np.array([0]))[0] == pytest.approx(1450.0)


def test_fgd_prefers_the_full_gpu_for_a_share_that_would_strand_the_half_one() -> None:
    # 300 milli on GPU 0 leaves 700, 1000, 500, 200: A still sees only 200 below 500, F = 1300.
    # On GPU 2 it leaves 1000, 1000, 200, 200: A now sees 400 below 500, F = 1400.
    frag = Fragmentation(NodeArrays((TINY,)), MIX)
    rows, slots, grow = frag.share_increase(pod("s", cpu=1, gpu=0.3), np.array([0]))
    assert list(rows) == [0, 0]
    assert list(slots) == [0, 2]  # GPU 1 is the same choice as GPU 0; GPU 3 has no room
    assert list(grow) == pytest.approx([1300 - 1450, 1400 - 1450])


def test_cluster_fragmentation_rate() -> None:
    # An empty 2-GPU node with 8 cores: A fits (nothing below 500), B lacks cores, C: 2000 each.
    empty = node("empty", cpu=8, gpus=2)
    rate = fragmentation_rate(NodeArrays((TINY, empty)), MIX)
    assert rate == pytest.approx((1450 + 0.25 * 2000 + 0.25 * 2000) / (2700 + 2000))


def after(info: NodeInfo, p: PodRequest, gpus: tuple[GpuShare, ...]) -> float:
    """after: F of the node once the pod is on it, from fresh node arrays."""
    arrays = NodeArrays((info,))
    arrays.apply(Allocation(0, p.cpu_milli, p.memory_bytes, gpus))
    return float(Fragmentation(arrays, MIX).values(np.array([0]))[0])


@pytest.mark.parametrize(
    "info",
    [
        TINY,
        node("n1", cpu=20, used_cpu=3, gpus=8, used=[1000, 300, 600, 0, 0, 950]),
        node("n2", cpu=6, gpus=2, used=[500]),
    ],
)
def test_increases_agree_with_recomputing_the_node(info: NodeInfo) -> None:
    arrays = NodeArrays((info,))
    frag = Fragmentation(arrays, MIX)
    before = frag.values(np.array([0]))[0]
    free = [1000 - g.used_milli for g in info.gpus]
    for share, cpu in itertools.product([0.2, 0.5, 0.7], [1, 4]):
        p = pod("s", cpu=cpu, gpu=share)
        _, slots, grow = frag.share_increase(p, np.array([0]))
        assert [int(s) for s in slots] == [
            i for i, f in enumerate(free) if f >= p.gpu_milli and f not in free[:i]
        ]
        for slot, g in zip(slots, grow, strict=True):
            assert g == pytest.approx(after(info, p, (GpuShare(int(slot), p.gpu_milli),)) - before)
    for whole, cpu in [(0, 2), (1, 1), (2, 4)]:
        p = pod("w", cpu=cpu, gpu=whole)
        taken = tuple(GpuShare(i, 1000) for i, f in enumerate(free) if f == 1000)[:whole]
        if len(taken) < whole:
            continue
        grow = frag.increase(p, np.array([0]))[0]
        assert grow == pytest.approx(after(info, p, taken) - before)


def test_refresh_follows_a_placement() -> None:
    arrays = NodeArrays((TINY,))
    frag = Fragmentation(arrays, MIX)
    arrays.apply(Allocation(0, 1000, 0, (GpuShare(0, 300),)))  # as in the test above
    frag.refresh(0)
    assert frag.values(np.array([0]))[0] == pytest.approx(1300.0)
