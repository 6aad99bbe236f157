"""A gang of one leader and a set of identical workers is placed whenever some placement of
it exists (CPU, memory, whole GPUs), under every basic policy, and the count the victim search
uses instead of trial placements (Room) agrees: checked against a brute-force search over
every way of putting the pods on the nodes."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from arranger.sched import JobInfo, NodeInfo, SchedulerConfig, Snapshot, run_cycle
from arranger.sched.actions.room import Room
from arranger.sched.session import Session
from arranger.sched.snapshot import PodRequest
from arranger.states import BasicPolicy
from tests.sched.builders import GI, node, pod

PLACE_ONLY = SchedulerConfig(actions=("enqueue", "allocate"))
Shape = tuple[int, int, int]  # cores, GiB, whole GPUs


def gang(leader: Shape, worker: Shape, count: int, policy: BasicPolicy) -> JobInfo:
    pods = [pod("g-l", *leader[:2], gpu=leader[2], leader=True)]
    pods += [pod(f"g-w{i}", *worker[:2], gpu=worker[2], rank=i) for i in range(count)]
    return JobInfo("g", "g", "default", 1, 0.0, tuple(pods), basic_policy=policy)


def some_placement(nodes: list[NodeInfo], leader: Shape, worker: Shape, count: int) -> bool:
    """some_placement: brute force over the leader's node and every multiset of the workers'
    nodes (workers are identical)."""
    free = [
        (
            n.cpu_milli - n.used_cpu_milli,
            n.memory_bytes,
            sum(1 for g in n.gpus if g.used_milli == 0),
        )
        for n in nodes
    ]
    for first in range(len(nodes)):
        for rest in itertools.combinations_with_replacement(range(len(nodes)), count):
            on = [first, *rest]
            if all(
                sum(
                    s[k] * scale
                    for s, where in zip([leader] + [worker] * count, on, strict=True)
                    if where == i
                )
                <= free[i][k]
                for i in range(len(nodes))
                for k, scale in enumerate((1000, GI, 1))
            ):
                return True
    return False


shapes = st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(0, 2))


@st.composite
def clusters(draw: st.DrawFn) -> list[NodeInfo]:
    nodes = []
    for i in range(draw(st.integers(1, 4))):
        cores = draw(st.sampled_from([2, 4, 8, 16]))
        gpus = draw(st.integers(0, 4))
        busy = draw(st.integers(0, gpus))
        nodes.append(
            node(
                f"n{i}",
                cpu=cores,
                memory_gi=draw(st.sampled_from([4, 8, 16])),
                gpus=gpus,
                used_cpu=draw(st.integers(0, cores)),
                gpu_used=[1000] * busy + [0] * (gpus - busy),
            )
        )
    return nodes


@settings(max_examples=600, deadline=None)
@given(
    clusters(),
    shapes,
    shapes,
    st.integers(1, 5),
    st.sampled_from([p for p in BasicPolicy if p != BasicPolicy.GANG]),
)
def test_a_gang_is_placed_whenever_some_placement_exists(
    nodes: list[NodeInfo], leader: Shape, worker: Shape, count: int, policy: BasicPolicy
) -> None:
    job = gang(leader, worker, count, policy)
    plan = run_cycle(Snapshot(0.0, tuple(nodes), (job,)), PLACE_ONLY)
    exists = some_placement(nodes, leader, worker, count)
    assert (len(plan.placements) == 1 + count) == exists
    assert len(plan.placements) in (0, 1 + count)  # all or nothing
    session = Session(Snapshot(0.0, tuple(nodes), (job,)), PLACE_ONLY)
    minimum: list[PodRequest] = session.minimum(job)
    room = Room(session, job, minimum)
    assert room.exact
    assert room.fits() == exists


def test_the_leader_goes_where_its_workers_still_fit() -> None:
    # The leader (2 cores, 4 GiB) fits on `a` and on `b`; BinPack likes `b` better (its
    # memory would be full). But the two workers (1 core, 1 GiB, 1 GPU each) fit only on
    # b's two GPUs, and not beside the leader there: the leader must go to `a`.
    nodes = (node("a", cpu=16, memory_gi=16), node("b", cpu=16, memory_gi=4, gpus=2))
    job = gang((2, 4, 0), (1, 1, 1), 2, BasicPolicy.BINPACK)
    plan = run_cycle(Snapshot(0.0, nodes, (job,)), PLACE_ONLY)
    assert sorted((p.pod, p.node) for p in plan.placements) == [
        ("g-l", "a"),
        ("g-w0", "b"),
        ("g-w1", "b"),
    ]
