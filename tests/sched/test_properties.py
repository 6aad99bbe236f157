"""Invariants of the scheduling core over generated clusters and jobs (hypothesis)."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arranger.sched import GPU_MILLI, JobInfo, NodeInfo, Res, Snapshot, run_cycle
from arranger.sched.nodes import NodeArrays
from arranger.sched.plugins import minfragment
from arranger.states import BasicPolicy, JobQueuePolicy
from tests.sched.builders import node, pod, queue

nodes_st = st.lists(
    st.builds(
        lambda i, cpu, mem, gpus, used: node(
            f"n{i:02d}", cpu=cpu, memory_gi=mem, gpus=gpus, used_cpu=min(used, cpu)
        ),
        st.integers(0, 99),
        st.integers(1, 16),
        st.integers(1, 64),
        st.integers(0, 4),
        st.integers(0, 8),
    ),
    min_size=1,
    max_size=8,
    unique_by=lambda n: n.name,
)


QUEUES = [
    queue("q0"),
    queue("q1", weight=2, cpu=6),
    queue("q2", cpu=3, gpu=1, allocated=Res(1000, 0, 0)),
]


@st.composite
def jobs_st(draw: st.DrawFn) -> list[JobInfo]:
    jobs = []
    for j in range(draw(st.integers(1, 6))):
        workers = draw(st.integers(0, 6))
        minimum = draw(st.integers(0, workers))
        gpu = draw(st.sampled_from([0, 0, 0.25, 0.5, 1, 2]))
        cpu = draw(st.sampled_from([0.5, 1, 2, 4]))
        pods = [pod(f"j{j}-l", cpu=cpu, gpu=gpu, leader=True)]
        pods += [
            pod(f"j{j}-w{i}", cpu=cpu, gpu=gpu, rank=i, in_minimum=i < minimum)
            for i in range(workers)
        ]
        jobs.append(
            JobInfo(
                id=f"j{j}",
                name=f"j{j}",
                queue=draw(st.sampled_from(["q0", "q1", "q2"])),
                priority=draw(st.integers(1, 10)),
                submit_time=float(j),
                pending=tuple(pods),
                basic_policy=draw(st.sampled_from(list(BasicPolicy))),
                job_queue_policy=draw(st.sampled_from(list(JobQueuePolicy))),
            )
        )
    return jobs


@settings(max_examples=300, deadline=None)
@given(nodes=nodes_st, jobs=jobs_st())
def test_never_overcommits_and_gangs_are_all_or_nothing(
    nodes: list[NodeInfo], jobs: list[JobInfo]
) -> None:
    snap = Snapshot(now=0.0, nodes=tuple(nodes), jobs=tuple(jobs), queues=tuple(QUEUES))
    plan = run_cycle(snap)
    by_name = {n.name: n for n in nodes}
    requests = {(j.id, p.name): p for j in jobs for p in j.pending}
    cpu: dict[str, int] = defaultdict(int)
    gpu: dict[tuple[str, int], int] = defaultdict(int)
    for n in nodes:
        cpu[n.name] = n.used_cpu_milli
    for placement in plan.placements:
        request = requests[(placement.job_id, placement.pod)]
        cpu[placement.node] += request.cpu_milli
        assert sum(g.milli for g in placement.gpus) == request.gpu_milli
        for share in placement.gpus:
            gpu[(placement.node, share.index)] += share.milli
    for name, used in cpu.items():
        if any(p.node == name for p in plan.placements):
            assert used <= by_name[name].cpu_milli, f"cpu overcommitted on {name}"
    assert all(milli <= GPU_MILLI for milli in gpu.values()), "a GPU is shared beyond 1.0"
    by_queue = {q.name: q.held_outside for q in QUEUES}
    queue_of = {j.id: j.queue for j in jobs}
    for placement in plan.placements:
        request = requests[(placement.job_id, placement.pod)]
        by_queue[queue_of[placement.job_id]] += request.request
    for q in QUEUES:
        assert by_queue[q.name].fits_in(q.capability) or by_queue[q.name] == q.held_outside, (
            f"{q.name} over capability"
        )
    placed = {(p.job_id, p.pod) for p in plan.placements}
    assert len(placed) == len(plan.placements), "a pod was placed twice"
    for job in jobs:
        minimum = {(job.id, p.name) for p in job.pending if p.in_minimum}
        extras = {(job.id, p.name) for p in job.pending if not p.in_minimum}
        got_min = minimum & placed
        assert got_min in (set(), minimum), f"gang {job.id} partly placed"
        if not got_min:
            assert not extras & placed, f"{job.id} got extras without its minimum"


@settings(max_examples=50, deadline=None)
@given(nodes=nodes_st, jobs=jobs_st())
def test_the_same_snapshot_gives_the_same_plan(nodes: list[NodeInfo], jobs: list[JobInfo]) -> None:
    snap = Snapshot(now=0.0, nodes=tuple(nodes), jobs=tuple(jobs), queues=tuple(QUEUES))
    assert run_cycle(snap) == run_cycle(
        Snapshot(0.0, tuple(reversed(nodes)), tuple(reversed(jobs)), tuple(reversed(QUEUES)))
    )


@settings(max_examples=100, deadline=None)
@given(nodes=nodes_st, jobs=jobs_st())
def test_rescoring_changed_nodes_one_by_one_gives_the_vectorised_plan(
    nodes: list[NodeInfo], jobs: list[JobInfo]
) -> None:
    """MinFragment rescoring a few changed nodes from its scores by usage decides exactly as a
    vectorised pass over them would."""
    snap = Snapshot(now=0.0, nodes=tuple(nodes), jobs=tuple(jobs), queues=tuple(QUEUES))
    one_by_one = run_cycle(snap)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(minfragment, "FEW_NODES", -1)
        assert run_cycle(snap) == one_by_one


@settings(max_examples=200, deadline=None)
@given(nodes=nodes_st, jobs=jobs_st())
def test_fits_one_agrees_with_fits(nodes: list[NodeInfo], jobs: list[JobInfo]) -> None:
    arrays = NodeArrays(tuple(nodes))
    for job in jobs:
        for request in job.pending:
            fits = arrays.fits(request, slice(None))
            assert [arrays.fits_one(request, n) for n in range(len(arrays))] == fits.tolist()
