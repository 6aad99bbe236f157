"""Fairness over many cycles, on the simulator: no reclaim ping-pong, no starvation with a
reservation, and preemption's invariants under random load (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from arranger.sched import SchedulerConfig
from arranger.sched.snapshot import JobInfo
from arranger.states import BasicPolicy
from tests.sched.builders import gang, node, queue
from tests.sched.simulator import Sim


def test_two_queues_never_reclaim_from_each_other_back_and_forth() -> None:
    sim = Sim([node(f"n{i}", cpu=8) for i in range(4)], [queue("a"), queue("b")])
    for i in range(8):  # queue a fills the cluster first, with elastic jobs
        sim.submit(gang(f"a{i}", workers=3, minimum=1, queue="a", submit_time=i), duration=1000)
    sim.run(3)
    for i in range(8):
        sim.submit(
            gang(f"b{i}", workers=3, minimum=1, queue="b", submit_time=10 + i), duration=1000
        )
    sim.run(60)
    directions = {
        (sim.jobs[e.for_job].info.queue, sim.jobs[e.job_id].info.queue)
        for plan in sim.plans
        for e in plan.evictions
    }
    assert directions == {("b", "a")}  # b took back from a; a never took back from b
    last = max(i for i, plan in enumerate(sim.plans) if plan.evictions)
    # One b job's minimum at a time (evict, let them stop, place): then nothing more, ever.
    assert last < 3 + 2 * 8 + 2, "evictions went on: the queues kept taking from each other"
    held = {"a": 0, "b": 0}
    for job in sim.jobs.values():
        held[job.info.queue] += len(job.running)
    assert held == {"a": 16, "b": 16}  # each its deserved half of the 32 cores


def _starvation(reserve: bool) -> int | None:
    actions = ("enqueue", "allocate", "preempt", "reclaim", "backfill") + (
        ("reserve",) if reserve else ()
    )
    sim = Sim(
        [node(f"n{i}", cpu=8) for i in range(4)],
        config=SchedulerConfig(actions=actions, starvation_threshold_s=5),
    )
    big = gang("big", workers=3, cpu=8, priority=8, policy=BasicPolicy.GANG, submit_time=0)
    sim.submit(JobInfo(**{**_fields(big), "preemptible": False, "waiting_since": 0.0}), duration=5)
    for cycle in range(80):
        for k in range(4):  # a steady stream of small urgent jobs
            small = gang(f"s{cycle}-{k}", workers=0, cpu=2, priority=9, submit_time=cycle + k / 10)
            sim.submit(small, duration=4)
        sim.step()
    return sim.jobs["big"].started


def test_without_a_reservation_the_big_job_starves() -> None:
    assert _starvation(reserve=False) is None


def test_with_a_reservation_the_big_job_starts_within_a_bounded_number_of_cycles() -> None:
    started = _starvation(reserve=True)
    # 5 cycles of threshold, 4 cycles locking one node each, up to 4 for the last small job
    # on a locked node to end, and a cycle to place it.
    assert started is not None and started <= 5 + 4 + 4 + 2


@st.composite
def workloads(draw: st.DrawFn) -> list[tuple[JobInfo, int, int]]:
    jobs = []
    for j in range(draw(st.integers(2, 10))):
        workers = draw(st.integers(0, 4))
        job = gang(
            f"j{j}",
            workers=workers,
            minimum=draw(st.integers(0, workers)),
            cpu=draw(st.sampled_from([1, 2, 3])),
            priority=draw(st.integers(1, 10)),
            queue=draw(st.sampled_from(["a", "b"])),
            submit_time=float(j),
            policy=draw(
                st.sampled_from([BasicPolicy.BINPACK, BasicPolicy.GANG, BasicPolicy.LEADER_FIRST])
            ),
        )
        jobs.append((job, draw(st.integers(0, 4)), draw(st.integers(1, 6))))  # arrival, duration
    return jobs


@settings(max_examples=60, deadline=None)
@given(work=workloads(), stop_cycles=st.integers(1, 4), seed=st.integers(0, 1000))
def test_preemption_never_cuts_a_job_below_its_minimum_nor_overfills_a_node(
    work: list[tuple[JobInfo, int, int]], stop_cycles: int, seed: int
) -> None:
    sim = Sim(
        [node("n0", cpu=6), node("n1", cpu=6)],
        [queue("a"), queue("b", weight=2)],
        stop_cycles=stop_cycles,
        seed=seed,
    )
    for cycle in range(12):
        for job, arrival, duration in work:
            if arrival == cycle:
                sim.submit(job, duration)
        snapshot = sim.snapshot()
        plan = sim.step()
        running = {j.id: j.running for j in snapshot.jobs}
        by_job: dict[str, set[str]] = {}
        for eviction in plan.evictions:
            by_job.setdefault(eviction.job_id, set()).add(eviction.pod)
        for job_id, pods in by_job.items():
            live = {p.name for p in running[job_id] if not p.terminating}
            cuts_minimum = any(p.in_minimum and p.name in pods for p in running[job_id])
            assert not cuts_minimum or pods == live, f"{job_id} cut below its minimum"
        for name, capacity in sim.nodes.items():
            on_node = [
                sim.pods(job)[pod]
                for job in sim.jobs.values()
                for pod, (where, _) in [*job.running.items(), *job.stopping.items()]
                if where == name
            ]
            assert sum(p.cpu_milli for p in on_node) <= capacity.cpu_milli, (
                f"{name}: cpu over-allocated"
            )
            assert sum(p.memory_bytes for p in on_node) <= capacity.memory_bytes, (
                f"{name}: memory over-allocated"
            )


def _fields(info):  # type: ignore[no-untyped-def]
    return {name: getattr(info, name) for name in info.__slots__}
