"""Shares that move as pods are placed: spare room above the gang minimums is handed out a pod
at a time to the job (and the queue) with the smallest share as it stands, not to whichever
came first when the cycle began."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from arranger.sched import Res, run_cycle
from arranger.sched.plan import Plan
from tests.sched.builders import gang, node, queue, snapshot

CORE = 1000


def placed(plan: Plan) -> Counter[str]:
    return Counter(p.job_id for p in plan.placements)


def test_two_drf_jobs_share_the_spare_room_as_their_shares_grow() -> None:
    # 16 cores. Two elastic DRF jobs of one queue, a leader and 1 worker minimum, 20 workers
    # wanted, one core each: after the minimums (4 cores), 12 spare cores go 6 and 6.
    first = gang("first", workers=20, minimum=1, drf=True, submit_time=1)
    second = gang("second", workers=20, minimum=1, drf=True, submit_time=2)
    plan = run_cycle(snapshot([node("n", cpu=16, memory_gi=64)], [first, second]))
    assert placed(plan) == {"first": 8, "second": 8}
    assert plan.decisions["first"].message.startswith("13 pods above the minimum wait")


def test_a_job_already_holding_more_gets_less_of_the_spare_room() -> None:
    # `rich` already holds 6 cores (its allocated share); the 10 spare cores even the two out.
    rich = gang(
        "rich", workers=20, minimum=0, drf=True, submit_time=1, allocated=Res(6 * CORE, 0, 0)
    )
    poor = gang("poor", workers=20, minimum=0, drf=True, submit_time=2)
    plan = run_cycle(snapshot([node("n", cpu=16, memory_gi=64, used_cpu=6)], [rich, poor]))
    # rich: 6 held + 1 leader; poor: 1 leader. 8 spare: poor catches up by 6, then 1 each.
    assert placed(plan) == {"rich": 1 + 1, "poor": 1 + 7}


def test_priority_comes_before_shares() -> None:
    high = gang("high", workers=20, minimum=0, drf=True, priority=9, submit_time=2)
    low = gang("low", workers=20, minimum=0, drf=True, priority=1, submit_time=1)
    plan = run_cycle(snapshot([node("n", cpu=16, memory_gi=64)], [high, low]))
    assert placed(plan) == {"high": 15, "low": 1}


def test_queues_share_spare_room_by_their_shares_as_they_grow() -> None:
    # Two queues of weight 1 on 16 cores; one elastic job each (priority order inside).
    a = gang("a", workers=30, minimum=0, queue="a", submit_time=1)
    b = gang("b", workers=30, minimum=0, queue="b", submit_time=2)
    plan = run_cycle(
        snapshot([node("n", cpu=16, memory_gi=64)], [a, b], queues=[queue("a"), queue("b")])
    )
    assert placed(plan) == {"a": 8, "b": 8}


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    sizes=st.lists(st.integers(1, 3), min_size=2, max_size=4),
    cores=st.integers(8, 40),
)
def test_drf_extras_end_within_one_pod_of_each_other(sizes: list[int], cores: int) -> None:
    """However many jobs and pod sizes, a DRF job took its last pod while its dominant share
    was at most that of every job still taking pods: none took spare room while another, with a
    smaller share, could have had it."""
    jobs = [
        gang(f"j{i}", workers=40, minimum=0, cpu=size, drf=True, submit_time=i, memory_gi=0)
        for i, size in enumerate(sizes)
    ]
    plan = run_cycle(snapshot([node("n", cpu=cores, memory_gi=64)], jobs))
    got = placed(plan)
    held = {job.id: got[job.id] * size for job, size in zip(jobs, sizes, strict=True)}
    free = cores - sum(held.values())
    # A job whose pods still fit what is left never left the turns.
    stayed = [job.id for job, size in zip(jobs, sizes, strict=True) if size <= free]
    for job, size in zip(jobs, sizes, strict=True):
        if got[job.id] > 1:  # took spare room (the leader is its minimum)
            for other in stayed:
                assert held[job.id] - size <= held[other], (got, held)
