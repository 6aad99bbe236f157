"""Preemption and reclaim over many cycles on generated clusters, queues (capped, with shares
that are not whole pods) and jobs, with the simulator's injected clock (hypothesis)."""

from __future__ import annotations

from hypothesis import Phase, given, settings
from hypothesis import seed as hyp_seed
from hypothesis import strategies as st

from arranger.sched import QueueInfo, Res
from arranger.sched.snapshot import JobInfo
from arranger.states import BasicPolicy
from tests.sched.builders import gang, node, queue
from tests.sched.simulator import Sim, taken_back

CYCLES = 14
UNDO_WINDOW = 6  # cycles within which an opposite eviction would undo one


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[int], list[QueueInfo]]:
    cpus = draw(st.lists(st.integers(2, 8), min_size=1, max_size=3))
    names = ["a", "b", "c"][: draw(st.integers(2, 3))]
    queues = [
        queue(
            name,
            weight=draw(st.sampled_from([1, 1, 2, 3])),
            cpu=draw(st.sampled_from([None, None, 3, 5, 7])),
        )
        for name in names
    ]
    return cpus, queues


@st.composite
def workloads(draw: st.DrawFn, queues: list[str]) -> list[tuple[JobInfo, int, int]]:
    jobs = []
    for j in range(draw(st.integers(2, 9))):
        workers = draw(st.integers(0, 3))
        job = gang(
            f"j{j}",
            workers=workers,
            minimum=draw(st.integers(0, workers)),
            cpu=draw(st.sampled_from([1, 2])),
            priority=draw(st.integers(1, 4)),
            queue=draw(st.sampled_from(queues)),
            submit_time=float(j),
            policy=draw(st.sampled_from([BasicPolicy.BINPACK, BasicPolicy.GANG])),
        )
        jobs.append((job, draw(st.integers(0, 5)), draw(st.integers(2, 30))))
    return jobs


def _run(
    cpus: list[int], queues: list[QueueInfo], work: list[tuple[JobInfo, int, int]], seed: int
) -> Sim:
    sim = Sim([node(f"n{i}", cpu=c) for i, c in enumerate(cpus)], queues, stop_cycles=2, seed=seed)
    for cycle in range(CYCLES):
        for job, arrival, duration in work:
            if arrival == cycle:
                sim.submit(job, duration)
        sim.step()
        _check_capacities(sim)
    return sim


def _check_capacities(sim: Sim) -> None:
    """No node over its capacity, no queue over its capability, every running job at or above
    its gang minimum."""
    caps = {q.name: q.capability for q in sim.queues}
    held: dict[str, Res] = {}
    for name, capacity in sim.nodes.items():
        on_node = [
            sim.pods(job)[pod]
            for job in sim.jobs.values()
            for pod, (where, _) in [*job.running.items(), *job.stopping.items()]
            if where == name
        ]
        assert sum(p.cpu_milli for p in on_node) <= capacity.cpu_milli, f"{name} over capacity"
    for job in sim.jobs.values():
        pods = sim.pods(job)
        for pod in [*job.running, *job.stopping]:
            held[job.info.queue] = held.get(job.info.queue, Res()) + pods[pod].request
        if job.started is not None and job.finished is None:
            minimum = {p.name for p in job.info.pending if p.in_minimum}
            assert minimum <= set(job.running), f"{job.info.id} runs below its minimum"
    for name, amount in held.items():
        assert amount.fits_in(caps[name]), f"queue {name} over its capability"


# Derandomized so that the suite checks the same examples every run. The room an eviction
# frees once went to whichever job came first, which could push that job's queue over its
# share and undo the eviction with demand unchanged; a claim (arranger.sched.plan.Claim) now
# keeps it for the job it was freed for, and seeds 1-11 with 120 examples each find no
# back-and-forth (test_freed_room_goes_to_the_job_it_was_freed_for keeps the case seed 3 found).
@settings(max_examples=40, deadline=None, derandomize=True)
@given(cluster=clusters(), data=st.data(), seed=st.integers(0, 1000))
def test_capacities_minimums_and_no_back_and_forth(
    cluster: tuple[list[int], list[QueueInfo]], data: st.DataObject, seed: int
) -> None:
    cpus, queues = cluster
    work = data.draw(workloads([q.name for q in queues]))
    sim = _run(cpus, queues, work, seed)
    queue_of = {job_id: job.info.queue for job_id, job in sim.jobs.items()}
    taken: list[tuple[int, str, str]] = []  # (cycle, taker's queue, victim's queue)
    for cycle, plan in enumerate(sim.plans):
        for eviction in plan.evictions:
            taker, victim = queue_of[eviction.for_job], queue_of[eviction.job_id]
            if taker != victim:
                taken.append((cycle, taker, victim))
    # Demand changes when a job arrives (seen by that cycle's plan) or finishes (seen by the
    # next cycle's): an opposite eviction after that answers the new demand. One with nothing
    # changed in between undoes the first.
    changes = {arrival for _, arrival, _ in work}
    changes |= {job.finished + 1 for job in sim.jobs.values() if job.finished is not None}
    assert not taken_back(taken, changes, UNDO_WINDOW), "a queue took back what it gave"


@st.composite
def capped_queues(draw: st.DrawFn) -> tuple[int, int, int, int, int]:
    capability = draw(st.integers(3, 10))
    low_minimum = draw(st.integers(0, 2))
    low_workers = draw(st.integers(low_minimum, capability - 1))  # low holds up to capability
    high_workers = draw(st.integers(0, capability - 1))  # high's minimum fits the capability
    return capability, low_minimum, low_workers, high_workers, draw(st.integers(0, 3))


@settings(max_examples=40, deadline=None)
@given(case=capped_queues(), stop_cycles=st.integers(1, 3), seed=st.integers(0, 1000))
def test_a_job_waiting_only_behind_lower_priority_work_of_its_queue_starts_soon(
    case: tuple[int, int, int, int, int], stop_cycles: int, seed: int
) -> None:
    capability, low_minimum, low_workers, high_workers, others = case
    sim = Sim(
        [node("n0", cpu=capability + 2), node("n1", cpu=capability)],
        [queue("capped", cpu=capability), queue("free")],
        stop_cycles=stop_cycles,
        seed=seed,
    )
    sim.submit(
        gang("low", workers=low_workers, minimum=low_minimum, priority=1, queue="capped"), 10_000
    )
    for i in range(others):  # other lower-priority work of the queue, whole gangs
        sim.submit(gang(f"o{i}", workers=0, priority=2, queue="capped", submit_time=i + 1), 10_000)
    sim.submit(gang("busy", workers=capability - 1, queue="free"), 10_000)
    sim.run(3)
    sim.submit(
        gang("high", workers=high_workers, priority=9, queue="capped", submit_time=50), 10_000
    )
    arrived = sim.cycle
    # Evict (a cycle), let the pods stop (stop_cycles), then place (a cycle).
    for _ in range(stop_cycles + 3):
        sim.step()
        _check_capacities(sim)
    started = sim.jobs["high"].started
    assert started is not None and started - arrived <= stop_cycles + 2


@hyp_seed(3)
@settings(max_examples=40, deadline=None, database=None, phases=[Phase.generate])
@given(cluster=clusters(), data=st.data(), seed=st.integers(0, 1000))
def test_freed_room_goes_to_the_job_it_was_freed_for(
    cluster: tuple[list[int], list[QueueInfo]], data: st.DataObject, seed: int
) -> None:
    """The case that found room freed for one job taken by another (before claims)."""
    test_capacities_minimums_and_no_back_and_forth.hypothesis.inner_test(cluster, data, seed)  # type: ignore[attr-defined]
