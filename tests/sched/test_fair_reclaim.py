"""Fair reclaim, judged per resource, victims from the queue most above its share first;
less work lost (checkpoints); queues' minRunSeconds. Each rule with its numbers."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from arranger.sched import JobInfo, QueueInfo, Res, SchedulerConfig, run_cycle
from tests.sched.builders import gang, node, queue
from tests.sched.simulator import Sim, taken_back
from tests.sched.test_minimal_victims import Cluster, evicted_jobs, waiting_job

RECLAIM_ONLY = SchedulerConfig(actions=("enqueue", "allocate", "reclaim"))


def test_a_queue_at_its_memory_share_reclaims_the_gpus_it_deserves_and_lacks() -> None:
    # 16 cores, 64 GiB, 4 GPUs; two queues of weight 1. Memory is contended (a asks 32 GiB,
    # b 48): each deserves 32 GiB, and a holds its 32. GPUs: a asks 1, b holds 4 and
    # deserves 3. a's dominant share is 1.0 (memory), yet it lacks the GPU it deserves: its
    # job (a core and a GPU) reclaims a GPU job of b's, which stays at its GPU share.
    cluster = Cluster([("n", 16, 64, 4)])
    for i in range(4):
        cluster.run(f"g{i}", [(1, 4, 1)], 1, priority=5, queue_name="b", started=float(i))
    cluster.run("mem", [(1, 32, 0)], 1, priority=5, queue_name="a")
    pending_b = waiting_job("bmem", [(1, 32, 0)], priority=1, queue_name="b")
    cluster.jobs.append(replace(pending_b, submit_time=60.0))
    queues = [queue("a"), queue("b")]
    wants = waiting_job("wants", [(1, 0, 1)], priority=1, queue_name="a")
    plan = run_cycle(cluster.snapshot(wants, queues), RECLAIM_ONLY)
    assert plan.deserved["a"].memory_bytes == 32 * 2**30 and plan.deserved["a"].gpu_milli == 1000
    assert evicted_jobs(plan) == ["g3"]  # the most recently started
    assert {e.for_job for e in plan.evictions} == {"wants"}


def test_victims_come_from_the_queue_most_above_its_share_first() -> None:
    # 12 cores, three queues of weight 1, each deserving 4. `b` holds 5 (1 above), `c` holds
    # 7 (3 above). `a` asks for 2: c gives them, and stays above its share; b is not touched.
    cluster = Cluster([("n", 12, 48, 0)])
    for i in range(5):
        cluster.run(f"b{i}", [(1, 1, 0)], 1, priority=1, queue_name="b", started=100.0 + i)
    for i in range(7):
        cluster.run(f"c{i}", [(1, 1, 0)], 1, priority=9, queue_name="c", started=float(i))
    queues = [queue("a"), queue("b"), queue("c")]
    wants = waiting_job("wants", [(1, 1, 0), (1, 1, 0)], queue_name="a")
    plan = run_cycle(cluster.snapshot(wants, queues), RECLAIM_ONLY)
    assert evicted_jobs(plan) == ["c5", "c6"]


def test_reclaim_never_leaves_the_victims_queue_below_its_share_for_a_queue_going_above() -> None:
    # 8 cores, GPUs none: a and b deserve 4 each. b holds 5 in jobs of 1 core plus a job of
    # 3: taking the 3-core job would leave b at 2 and take a (asking 3 more, holding 2) to 5.
    cluster = Cluster([("n", 8, 32, 0)])
    cluster.run("a0", [(2, 2, 0)], 1, priority=9, queue_name="a")
    cluster.run("b0", [(3, 3, 0)], 1, priority=1, queue_name="b", started=50.0)
    cluster.run("b1", [(1, 1, 0)], 1, priority=1, queue_name="b")
    cluster.run("b2", [(1, 1, 0)], 1, priority=1, queue_name="b")
    queues = [queue("a"), queue("b")]
    plan = run_cycle(cluster.snapshot(waiting_job("w", [(3, 3, 0)], queue_name="a"), queues))
    assert plan.evictions == []
    assert {r.action: r.reason for r in plan.refusals}["reclaim"] == "WouldCrossShares"


def test_of_equal_victims_the_freshest_checkpoint_goes_first() -> None:
    # Three whole jobs of one pod, same priority. Without checkpoints the latest started
    # goes (least work lost); a checkpoint confirmed later than that start goes before it.
    cluster = Cluster([("n", 3, 12, 0)])
    old = cluster.run("old", [(1, 1, 0)], 1, priority=1, started=0.0)
    cluster.run("mid", [(1, 1, 0)], 1, priority=1, started=10.0)
    cluster.run("new", [(1, 1, 0)], 1, priority=1, started=20.0)
    plan = run_cycle(cluster.snapshot(waiting_job("w", [(1, 1, 0)]), []))
    assert evicted_jobs(plan) == ["new"]
    assert old is not None
    cluster.jobs[0] = replace(old, checkpoint_time=95.0)  # 5 s of work since then
    plan = run_cycle(cluster.snapshot(waiting_job("w", [(1, 1, 0)]), []))
    assert evicted_jobs(plan) == ["old"]


def test_a_queues_min_run_seconds_shields_its_young_pods_and_the_plan_wakes_when_it_ends() -> None:
    # now = 100. `young` started at 80, its queue's minRunSeconds is 60: shielded until 140.
    cluster = Cluster([("n", 2, 8, 0)])
    cluster.run("young", [(1, 1, 0)], 1, priority=1, started=80.0)
    cluster.run("older", [(1, 1, 0)], 1, priority=1, started=10.0)
    shielded = [replace(queue("default"), min_run_s=60.0)]
    plan = run_cycle(cluster.snapshot(waiting_job("w", [(1, 1, 0)]), shielded))
    assert evicted_jobs(plan) == ["older"]  # the newest would go, but it is shielded
    plan = run_cycle(cluster.snapshot(waiting_job("w", [(2, 2, 0)]), shielded))
    assert plan.evictions == [] and plan.wake_at == 140.0
    refusal = next(r for r in plan.refusals if r.action == "preempt")
    assert refusal.reason == "VictimRanTooBriefly"
    assert "1 have run less than their queue's minRunSeconds" in refusal.message


# Over many cycles (the simulator's injected clock), with two contended resources: jobs that
# are CPU-heavy or memory-heavy in queues of different weights. No queue takes back what it
# gave with nothing changed in between, and the cross-queue evictions of a cycle with nothing
# stopping and one taking queue leave, in each resource taken, the victim's queue at or above
# its share or the taker's within its own.


@st.composite
def mixed_work(
    draw: st.DrawFn,
) -> tuple[list[tuple[int, int]], list[QueueInfo], list[tuple[JobInfo, int, int]]]:
    nodes = draw(st.lists(st.tuples(st.integers(2, 6), st.integers(2, 8)), min_size=1, max_size=3))
    queues = [queue(name, weight=draw(st.sampled_from([1, 2]))) for name in ("a", "b", "c")]
    work = []
    for j in range(draw(st.integers(3, 9))):
        workers = draw(st.integers(0, 2))
        cpu, memory = draw(st.sampled_from([(1, 1), (2, 1), (1, 2), (1, 3), (3, 1)]))
        job = gang(
            f"j{j}",
            workers=workers,
            minimum=draw(st.integers(0, workers)),
            cpu=cpu,
            memory_gi=memory,
            priority=draw(st.integers(1, 4)),
            queue=draw(st.sampled_from("abc")),
            submit_time=float(j),
        )
        work.append((job, draw(st.integers(0, 6)), draw(st.integers(3, 30))))
    return nodes, queues, work


@settings(max_examples=80, deadline=None, derandomize=True)
@given(case=mixed_work(), seed=st.integers(0, 100))
def test_two_contended_resources_no_back_and_forth_and_no_crossing(
    case: tuple[list[tuple[int, int]], list[QueueInfo], list[tuple[JobInfo, int, int]]], seed: int
) -> None:
    nodes, queues, work = case
    sim = Sim(
        [node(f"n{i}", cpu=c, memory_gi=m) for i, (c, m) in enumerate(nodes)],
        queues,
        stop_cycles=2,
        seed=seed,
    )
    taken: list[tuple[int, str, str]] = []
    for cycle in range(16):
        for job, arrival, duration in work:
            if arrival == cycle:
                sim.submit(job, duration)
        snap = sim.snapshot()
        plan = sim.step()
        # What each queue holds as preempt and reclaim see it: after allocate's placements of
        # gang minimums (backfill places the pods above them afterwards).
        held: dict[str, Res] = {}
        for info in snap.jobs:
            held[info.queue] = held.get(info.queue, Res()) + info.allocated
        waiting = {(j.id, p.name): (j.queue, p) for j in snap.jobs for p in j.pending}
        for placement in plan.placements:
            name, pod = waiting[(placement.job_id, placement.pod)]
            if pod.in_minimum:
                held[name] = held.get(name, Res()) + pod.request
        queue_of = {j.id: j.queue for j in snap.jobs}
        pods = {(j.id, p.name): p for j in snap.jobs for p in j.running}
        lost: dict[str, Res] = {}  # what each queue gives up this cycle
        gained: dict[str, Res] = {}  # the minimums of its jobs that evict this cycle
        pairs: dict[tuple[str, str], Res] = {}  # (taker, victim): what crossed
        for job_id in {e.for_job for e in plan.evictions}:
            job = next(j for j in snap.jobs if j.id == job_id)
            minimum = Res.total(p for p in job.pending if p.in_minimum)
            gained[job.queue] = gained.get(job.queue, Res()) + minimum
        for e in plan.evictions:
            victim, taker = queue_of[e.job_id], queue_of[e.for_job]
            request = pods[(e.job_id, e.pod)].request
            lost[victim] = lost.get(victim, Res()) + request
            if victim != taker:
                taken.append((cycle, taker, victim))
                pairs[(taker, victim)] = pairs.get((taker, victim), Res()) + request
        # Where pods are still stopping, preempt and reclaim see the cluster without them and
        # with the room claimed for others: the crossing is checked where that view is plain.
        # With several queues taking in one cycle, each taking was judged as it came (pods are
        # whole: one queue may end a pod above its share while another ends below); the
        # crossing is checked where one queue took.
        plain = not snap.claims and not any(p.terminating for j in snap.jobs for p in j.running)
        plain = plain and len({taker for taker, _ in pairs}) == 1
        for (taker, victim), amount in pairs.items() if plain else ():
            nothing = Res()
            # What the victim's queue holds after: less what it gave, plus its own preemptors.
            kept = held.get(victim, nothing) - lost.get(victim, nothing)
            left = (kept + gained.get(victim, nothing)).as_tuple()
            after = held.get(taker, nothing) - lost.get(taker, nothing) + gained[taker]
            due, own = plan.deserved[victim].as_tuple(), plan.deserved[taker].as_tuple()
            for i, part in enumerate(amount.as_tuple()):
                assert not (part > 0 and left[i] < due[i] and after.as_tuple()[i] > own[i]), (
                    f"cycle {cycle}: {taker} took resource {i} from {victim} across shares"
                )
    changes = {arrival for _, arrival, _ in work}
    changes |= {j.finished + 1 for j in sim.jobs.values() if j.finished is not None}
    assert not taken_back(taken, changes), "a queue took back what it gave"


def test_a_claimants_queue_has_had_its_turn_when_the_others_start() -> None:
    """j0 (queue a) reclaims j1 (b) whole; when the pods are gone j0 takes its room and the
    queues take turns from their shares with it placed: b's j3 gets what is left, not a's j2,
    which would take a over its share, and b would take it back (found by the randomized
    property test above)."""
    queues = [queue(name) for name in "abc"]
    sim = Sim([node("n0", cpu=4, memory_gi=2)], queues, stop_cycles=2, seed=0)
    work = [
        (gang("j1", workers=1, cpu=2, memory_gi=1, priority=1, queue="b", submit_time=1.0), 0),
        (gang("j3", workers=0, cpu=1, memory_gi=1, priority=1, queue="b", submit_time=3.0), 0),
        (gang("j0", workers=0, cpu=1, memory_gi=1, priority=1, queue="a", submit_time=0.0), 1),
        (gang("j2", workers=0, cpu=2, memory_gi=1, priority=1, queue="a", submit_time=2.0), 1),
    ]
    taken: list[tuple[int, str, str]] = []
    placed: dict[int, set[str]] = {}
    for cycle in range(8):
        for job, arrival in work:
            if arrival == cycle:
                sim.submit(job, 3)
        queue_of = {j.id: j.queue for j in sim.snapshot().jobs}
        plan = sim.step()
        placed[cycle] = {p.job_id for p in plan.placements}
        taken += [
            (cycle, queue_of[e.for_job], queue_of[e.job_id])
            for e in plan.evictions
            if queue_of[e.for_job] != queue_of[e.job_id]
        ]
    assert taken[:1] == [(1, "a", "b")]
    assert placed[4] == {"j0", "j3"}
    assert not taken_back(taken, {0, 1}), taken
