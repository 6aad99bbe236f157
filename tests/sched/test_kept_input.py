"""The core's input kept from cycle to cycle decides exactly as the input built afresh.

Node arrays updated node by node (changed, new and gone nodes) equal arrays built from the new
nodes, and copies do not change with them; a cycle handed kept arrays and a job index gives
the plan it gives without them, over many cycles of placement, preemption and reclaim.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arranger.sched import GpuInfo, JobInfo, NodeInfo, QueueInfo, Snapshot, run_cycle
from arranger.sched.nodes import Allocation, NodeArrays
from arranger.sched.plan import GpuShare
from arranger.sched.plugins.minfragment import mix_of_shapes, snapshot_mix
from arranger.sched.snapshot import index_jobs
from tests.sched.builders import GI, node, pod, same_arrays
from tests.sched.simulator import Sim
from tests.sched.test_preemption_properties import CYCLES, clusters, workloads
from tests.sched.test_properties import QUEUES, jobs_st, nodes_st


@st.composite
def a_node(draw: st.DrawFn, name: str) -> NodeInfo:
    gpus = draw(st.integers(0, 3))
    used = draw(st.lists(st.sampled_from([0, 0, 250, 500, 1000]), min_size=gpus, max_size=gpus))
    cpu = draw(st.integers(1, 16)) * 1000
    return NodeInfo(
        name=name,
        cpu_milli=cpu,
        memory_bytes=draw(st.integers(1, 64)) * GI,
        gpus=tuple(
            GpuInfo(i, draw(st.sampled_from(["A100", "T4"])), u) for i, u in enumerate(used)
        ),
        used_cpu_milli=draw(st.integers(0, cpu)),
        used_memory_bytes=draw(st.integers(0, GI)),
        labels=draw(st.sampled_from([{}, {"zone": "a"}, {"group": "g1"}])),
        schedulable=draw(st.booleans()),
        ready=draw(st.booleans()),
        containers=draw(st.booleans()),
    )


def _next(draw: st.DrawFn, before: list[NodeInfo]) -> list[NodeInfo]:
    """_next: the node set after some nodes stay, change, go or come (over 8 names)."""
    after: list[NodeInfo] = []
    for info in before:
        fate = draw(st.sampled_from(["same", "same", "changed", "gone"]))
        if fate == "same":
            after.append(info)
        elif fate == "changed":
            after.append(draw(a_node(info.name)))
    known = {n.name for n in before}
    return after + [
        draw(a_node(f"n{i}")) for i in range(8) if f"n{i}" not in known and draw(st.booleans())
    ]


@st.composite
def histories(draw: st.DrawFn) -> list[list[NodeInfo]]:
    """Node sets one after another, as a kept cluster sees them."""
    history = [[draw(a_node(f"n{i}")) for i in range(8) if draw(st.booleans())]]
    for _ in range(draw(st.integers(1, 4))):
        history.append(_next(draw, history[-1]))
    return history


def _built(nodes: list[NodeInfo]) -> NodeArrays:
    arrays = NodeArrays(nodes)
    arrays.keep_label("group")
    return arrays


def _changes(before: list[NodeInfo], after: list[NodeInfo]) -> dict[str, NodeInfo | None]:
    changed: dict[str, NodeInfo | None] = {n.name: n for n in after}
    changed.update({n.name: None for n in before if n.name not in changed})
    return changed


@settings(max_examples=300, deadline=None)
@given(histories())
def test_updated_arrays_equal_arrays_built_from_the_new_nodes(
    history: list[list[NodeInfo]],
) -> None:
    """After each update the kept arrays equal arrays built afresh; every copy handed out
    (copy on write) or copied before still equals the arrays of its time."""
    kept = _built(history[0])
    copies: list[tuple[NodeArrays, NodeArrays, list[NodeInfo]]] = []
    for before, after in itertools.pairwise(history):
        copies.append((kept.handed_out(), kept.copy(), before))
        kept.update(_changes(before, after))
        fresh = NodeArrays(after)
        values, labelled = fresh.label_column("group")  # computed, not kept
        assert kept.label_column("group")[0] == values
        assert np.array_equal(kept.label_column("group")[1], labelled)
        assert same_arrays(kept, _built(after))
        assert same_arrays(kept.emptied(), _built(after).emptied())
        for handed, copied, nodes in copies:
            assert same_arrays(handed, _built(nodes)), "a handed-out copy changed"
            assert same_arrays(copied, _built(nodes)), "a copy changed"


@settings(max_examples=100, deadline=None)
@given(histories())
def test_a_handed_out_copy_updated_leaves_the_kept_arrays_as_they_were(
    history: list[list[NodeInfo]],
) -> None:
    kept = _built(history[0])
    handed = kept.handed_out()
    handed.update(_changes(history[0], history[1]))
    assert same_arrays(handed, _built(history[1]))
    assert same_arrays(kept, _built(history[0]))


@pytest.mark.parametrize("how", ["copy", "for_cycle"])
def test_a_placement_on_a_copy_leaves_the_original_as_it_was(how: str) -> None:
    nodes = [NodeInfo("a", 8000, 8 * GI, (GpuInfo(0, "A100"), GpuInfo(1, "A100")))]
    original = NodeArrays(nodes)
    copy = original.copy() if how == "copy" else original.for_cycle()
    copy.apply(Allocation(0, 1000, GI, (GpuShare(1, 500),)))
    assert copy.gpu_used[0] == [0, 500] and int(copy.used_cpu[0]) == 1000
    assert int(copy.used_gpu[0]) == 500 and int(copy.free_whole[0]) == 1
    assert same_arrays(original, NodeArrays(nodes))
    empty = original.emptied()
    empty.apply(Allocation(0, 0, 0, (GpuShare(0, 1000),)))
    assert original.emptied().gpu_used[0] == [0, 0], "the empty cluster's GPUs were changed"
    assert original.fits(pod("p", gpu=2), slice(None)).tolist() == [True]


class KeptSim(Sim):
    """KeptSim hands each cycle node arrays kept from the last one (only the nodes that
    changed updated) and the job index, after checking the plan equals the one the cycle
    gives on the snapshot alone."""

    def __init__(self, nodes: list[NodeInfo], queues: list[QueueInfo]) -> None:
        super().__init__(nodes, queues, stop_cycles=2)
        self.table: NodeArrays | None = None
        self.last: dict[str, NodeInfo] = {}
        self.compared = 0

    def snapshot(self) -> Snapshot:
        snap = super().snapshot()
        infos = {n.name: n for n in snap.nodes}
        if self.table is None:
            self.table = NodeArrays(snap.nodes)
        else:
            changed: dict[str, NodeInfo | None] = {
                name: info for name, info in infos.items() if self.last.get(name) != info
            }
            changed.update({name: None for name in self.last if name not in infos})
            self.table.update(changed)
        self.last = infos
        kept = dataclasses.replace(
            snap, arrays=self.table.copy(), index=index_jobs(snap.jobs, snap.queues)
        )
        assert same_arrays(self.table, NodeArrays(snap.nodes))
        assert run_cycle(kept, self.config) == run_cycle(snap, self.config)
        assert kept.index is not None and kept.index.shapes is not None
        assert mix_of_shapes(kept.index.shapes) == snapshot_mix(snap.jobs)
        self.compared += 1
        return kept


@settings(max_examples=60, deadline=None)
@given(cluster=clusters(), data=st.data())
def test_kept_input_gives_the_same_plans_through_preemption_and_reclaim(
    cluster: tuple[list[int], list[QueueInfo]], data: st.DataObject
) -> None:
    cpus, queues = cluster
    work = data.draw(workloads([q.name for q in queues]))
    sim = KeptSim([node(f"n{i}", cpu=c) for i, c in enumerate(cpus)], queues)
    for cycle in range(CYCLES):
        for job, arrival, duration in work:
            if arrival == cycle:
                sim.submit(job, duration)
        sim.step()
    assert sim.compared == CYCLES


@settings(max_examples=150, deadline=None)
@given(nodes=nodes_st, jobs=jobs_st())
def test_kept_input_gives_the_same_plan_for_every_policy(
    nodes: list[NodeInfo], jobs: list[JobInfo]
) -> None:
    snap = Snapshot(now=0.0, nodes=tuple(nodes), jobs=tuple(jobs), queues=tuple(QUEUES))
    table = NodeArrays(nodes).handed_out()
    kept = dataclasses.replace(snap, arrays=table, index=index_jobs(snap.jobs, snap.queues))
    assert run_cycle(kept) == run_cycle(snap)
