"""MinFragment: where shares of GPUs go, against the request mix, and its cached scores."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from arranger.sched import Plan, Res, SchedulerConfig, run_cycle
from arranger.sched.cluster import Snapshot
from arranger.sched.fragmentation import request_mix
from arranger.sched.plan import GpuShare
from arranger.sched.plugins import minfragment
from arranger.sched.plugins.minfragment import MinFragment, bound_demand, snapshot_mix
from arranger.sched.session import Session
from arranger.sched.snapshot import JobInfo, PodRequest, RunningPod
from arranger.sched.statement import Statement
from arranger.states import BasicPolicy
from tests.sched.builders import gang, job_of, node, pod, snapshot

# The workload: mostly half GPUs, now and then 0.3 of one.
MIX = request_mix([pod(f"h{i}", gpu=0.5) for i in range(9)] + [pod("t", gpu=0.3)])


def placed(plan: Plan) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {p.pod: (p.node, tuple(g.index for g in p.gpus)) for p in plan.placements}


def one_share(policy: BasicPolicy, share: float = 0.3) -> JobInfo:
    return dataclasses.replace(job_of("j", pod("j-l", leader=True, gpu=share)), basic_policy=policy)


def test_a_rare_share_leaves_a_hole_the_common_shares_can_fill() -> None:
    # Free 1000 and 600 milli-GPU. The fullest GPU (BinPack's pick) would keep 300: no half
    # fits there ever again. The empty one keeps 700, where a half still fits.
    nodes = [node("a", gpus=2, gpu_used=[0, 400])]
    with_mix = Snapshot(
        100.0, tuple(nodes), (one_share(BasicPolicy.MIN_FRAGMENT),), request_mix=MIX
    )
    assert placed(run_cycle(with_mix)) == {"j-l": ("a", (0,))}
    assert placed(run_cycle(snapshot(nodes, [one_share(BasicPolicy.BINPACK)]))) == {
        "j-l": ("a", (1,))
    }


def test_the_same_holds_across_nodes() -> None:
    nodes = [node("a", gpus=1, gpu_used=[400]), node("b", gpus=1)]
    with_mix = Snapshot(
        100.0, tuple(nodes), (one_share(BasicPolicy.MIN_FRAGMENT),), request_mix=MIX
    )
    assert placed(run_cycle(with_mix)) == {"j-l": ("b", (0,))}
    assert placed(run_cycle(snapshot(nodes, [one_share(BasicPolicy.BINPACK)])))["j-l"][0] == "a"


def test_without_a_mix_the_snapshot_pods_are_the_workload() -> None:
    # Eight halves running elsewhere make halves the common class, as MIX did.
    halves = tuple(
        RunningPod(f"r{i}", "c", Res(1000, 2**30, 500), (GpuShare(i // 2, 500),)) for i in range(8)
    )
    running = JobInfo("r", "r", "default", 5, 0.0, (), halves, allocated=Res(8000, 8 * 2**30, 4000))
    nodes = [node("a", gpus=2, gpu_used=[0, 400]), node("c", cpu=16, gpus=4, gpu_used=[1000] * 4)]
    job = one_share(BasicPolicy.MIN_FRAGMENT)
    mix = snapshot_mix((running, job))
    assert [(c.share, p) for c, p in zip(mix.classes, mix.popularity, strict=True)] == [
        (500, 8 / 9),
        (300, 1 / 9),
    ]
    assert placed(run_cycle(snapshot(nodes, [running, job])))["j-l"] == ("a", (0,))


def test_shares_of_a_worker_set_fill_gpus_without_overfilling_any() -> None:
    nodes = [node(n, cpu=16, gpus=2) for n in "abcd"]
    job = gang("j", workers=8, gpu=0.5, policy=BasicPolicy.MIN_FRAGMENT)
    job = dataclasses.replace(job, pending=tuple(p for p in job.pending if p.name != "j-l"))
    plan = run_cycle(snapshot(nodes, [job]))
    used: dict[tuple[str, int], int] = {}
    for p in plan.placements:
        for share in p.gpus:
            used[p.node, share.index] = used.get((p.node, share.index), 0) + share.milli
    assert len(plan.placements) == 8
    assert sorted(used.values()) == [1000] * 4  # packed: four GPUs full, four whole ones free


def test_cached_scores_follow_every_allocation() -> None:
    nodes = [
        node(f"n{i}", cpu=16, gpus=4, gpu_used=[0, 300, 500, 900][: i % 4 + 1] + [0] * (3 - i % 4))
        for i in range(12)
    ]
    job = one_share(BasicPolicy.MIN_FRAGMENT)
    session = Session(Snapshot(100.0, tuple(nodes), (job,), request_mix=MIX), SchedulerConfig())
    plugin = getattr(session.gpu_choosers[BasicPolicy.MIN_FRAGMENT], "__self__", None)
    assert isinstance(plugin, MinFragment)
    statement = Statement(session)
    rng = np.random.default_rng(7)
    for share in (0.3, 0.5, 0.3, 0.5, 0.5, 0.3, 0.5):
        p = pod("x", gpu=share)
        scores = plugin.score(p, job, slice(None)).copy()  # cached, brought up to date
        fresh = plugin.state().node_scores(p, np.arange(len(nodes)))[0]
        np.testing.assert_array_equal(scores, fresh)
        room = [n for n in range(len(nodes)) if np.isfinite(scores[n])]
        target = int(rng.choice(room))
        gpus = session.choose_gpus(session.nodes, target, p, job)
        assert gpus is not None
        statement.allocate(job, p, target, gpus)
        assert plugin.score(p, job, target) == fresh_one(plugin, p, target)


def fresh_one(plugin: MinFragment, p: PodRequest, node: int) -> float:
    return float(plugin.state().node_scores(p, np.array([node]))[0][0])


def whole_gpu(policy: BasicPolicy, gpu_type: str = "") -> JobInfo:
    return dataclasses.replace(
        job_of("j", pod("j-l", leader=True, gpu=1, gpu_type=gpu_type)), basic_policy=policy
    )


# Nodes of a scarce model (T4) and a plentiful one (G2), the scarce one first by name.
MODELS = [node("a", cpu=16, gpus=2, model="T4"), node("b", cpu=16, gpus=6, model="G2")]
ANY = [pod(f"any{i}", gpu=1) for i in range(6)]


def test_a_pod_that_may_use_any_model_leaves_the_scarce_model_to_the_pods_bound_to_it() -> None:
    bound = request_mix([*ANY, *(pod(f"t{i}", gpu=1, gpu_type="T4") for i in range(3))])
    job = whole_gpu(BasicPolicy.MIN_FRAGMENT)
    with_bound = Snapshot(100.0, tuple(MODELS), (job,), request_mix=bound)
    assert placed(run_cycle(with_bound))["j-l"][0] == "b"
    # Without pods bound to T4 the same pod goes to the T4 node: only the binding moves it.
    free = Snapshot(100.0, tuple(MODELS), (job,), request_mix=request_mix(ANY))
    assert placed(run_cycle(free))["j-l"][0] == "a"
    # A pod bound to T4 still goes there.
    t4 = Snapshot(
        100.0, tuple(MODELS), (whole_gpu(BasicPolicy.MIN_FRAGMENT, "T4"),), request_mix=bound
    )
    assert placed(run_cycle(t4))["j-l"][0] == "a"


def test_bound_demand_splits_a_class_over_its_models_by_their_gpus() -> None:
    mix = request_mix(
        [pod("any", gpu=1), pod("t", gpu=1, gpu_type="T4"), pod("v", gpu=0.5, gpu_type="V|T4")]
    )
    share = bound_demand(mix, ["G2", "T4", "V"], np.array([6000.0, 2000.0, 2000.0]))
    assert share is not None
    np.testing.assert_allclose(share, [0.0, (1000 + 250) / 2500, 250 / 2500])
    assert bound_demand(request_mix(ANY), ["G2", "T4"], np.array([1.0, 1.0])) is None


def test_nodes_that_reach_the_same_usage_share_their_score() -> None:
    nodes = [node(f"n{i}", cpu=16, gpus=4, model="T4" if i % 2 else "G2") for i in range(4)]
    job = one_share(BasicPolicy.MIN_FRAGMENT)
    session = Session(Snapshot(100.0, tuple(nodes), (job,), request_mix=MIX), SchedulerConfig())
    plugin = getattr(session.gpu_choosers[BasicPolicy.MIN_FRAGMENT], "__self__", None)
    assert isinstance(plugin, MinFragment)
    statement = Statement(session)
    p = pod("x", gpu=0.3)
    for target in range(4):  # the same share on every node: one usage, computed once
        gpus = session.choose_gpus(session.nodes, target, p, job)
        assert gpus is not None
        statement.allocate(job, p, target, gpus)
        assert plugin.score(p, job, target) == fresh_one(plugin, p, target)
    assert len(plugin.state().by_usage) <= 3  # empty, one share: the models make no difference
    bound = pod("y", gpu=0.3, gpu_type="T4")  # a pod naming models tells the models apart
    assert [plugin.score(bound, job, n) for n in range(4)] == [
        fresh_one(plugin, bound, n) for n in range(4)
    ]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(*[st.integers(0, 3)] * 4), max_size=40))
def test_kinds_groups_exactly_the_nodes_alike_in_every_column(rows: list[tuple[int, ...]]) -> None:
    columns = [np.array([row[c] for row in rows], dtype=np.int64) for c in range(4)]
    kind = minfragment.kinds(columns)
    assert len(kind) == len(rows)
    for i, j in itertools.combinations(range(len(rows)), 2):
        assert (kind[i] == kind[j]) == (rows[i] == rows[j])
