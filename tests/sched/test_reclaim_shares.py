"""Reclaim and cross-queue preemption when deserved shares are not whole pods: a queue that
stays within its own deserved share takes from queues above theirs, even by less than a pod."""

from __future__ import annotations

from arranger.sched import run_cycle
from arranger.sched.snapshot import JobInfo
from arranger.states import BasicPolicy
from tests.sched.builders import gang, node, queue, snapshot
from tests.sched.simulator import Sim
from tests.sched.test_preemption import evicted, running_job

QUEUES = [queue("a"), queue("b"), queue("c")]


def pairs(queue_name: str, count: int, priority: int = 1) -> list[JobInfo]:
    """pairs: `count` running jobs of two one-core pods each, both in the minimum, on node n."""
    return [
        running_job(
            f"{queue_name}{i}",
            pods=2,
            minimum=2,
            priority=priority,
            queue_name=queue_name,
            started=float(i),
        )
        for i in range(count)
    ]


def test_three_queues_over_by_less_than_a_pod_still_give_back() -> None:
    # 8 cores, three queues of weight 1 that all ask for more than a third: each deserves
    # 2.67. b and c hold 4 each, in jobs of 2 cores: each is above its share by 1.33, less
    # than one of its jobs. a holds nothing and waits with two jobs of 2 cores.
    running = pairs("b", 2) + pairs("c", 2)
    waiting = [
        gang("a0", workers=1, queue="a", submit_time=1),
        gang("a1", workers=1, queue="a", submit_time=2),
    ]
    plan = run_cycle(snapshot([node("n", cpu=8, used_cpu=8)], running + waiting, queues=QUEUES))
    assert all(d.cpu_milli == 2666 for d in plan.deserved.values())
    # a0 takes one whole job (a ends at 2 <= 2.67); a1 would take a to 4: it waits.
    assert evicted(plan) == ["b1-0", "b1-1"]  # the newest, then by id
    assert {e.for_job for e in plan.evictions} == {"a0"}
    assert plan.decisions["a1"].reason != "Preempting"


def test_a_high_priority_job_preempts_low_priority_work_of_a_queue_over_by_less_than_a_pod() -> (
    None
):
    running = pairs("b", 2, priority=1) + pairs("c", 2, priority=9)
    waiting = [
        gang("urgent", workers=1, queue="a", priority=8),
        gang("later", workers=1, queue="a", priority=1, submit_time=5),
    ]
    plan = run_cycle(snapshot([node("n", cpu=8, used_cpu=8)], running + waiting, queues=QUEUES))
    assert evicted(plan) == ["b1-0", "b1-1"]  # the priority-1 job, not c's priority 9
    assert {e.for_job for e in plan.evictions} == {"urgent"}


def test_a_queue_that_would_go_above_its_share_takes_nothing_below_the_victims_share() -> None:
    # b is above its share by 1.33; a already holds 2 of its 2.67 and asks for 2 more.
    running = pairs("a", 1, priority=5) + pairs("b", 2) + pairs("c", 1)
    more = gang("a9", workers=1, queue="a", submit_time=9)
    plan = run_cycle(snapshot([node("n", cpu=8, used_cpu=8)], [*running, more], queues=QUEUES))
    assert plan.evictions == []


def test_three_queues_settle_without_taking_back_and_forth() -> None:
    # 3 nodes of 4 cores; three queues each asking for more than the whole cluster, in jobs
    # of 3 one-core pods: each deserves 4, one job and a third.
    sim = Sim([node(f"n{i}", cpu=4) for i in range(3)], QUEUES, stop_cycles=2)
    for i in range(4):  # a and b fill the cluster first
        sim.submit(gang(f"a{i}", workers=2, queue="a", submit_time=i), duration=1000)
        sim.submit(gang(f"b{i}", workers=2, queue="b", submit_time=i), duration=1000)
    sim.run(3)
    for i in range(4):
        sim.submit(gang(f"c{i}", workers=2, queue="c", submit_time=10 + i), duration=1000)
    sim.run(30)
    directions = [
        (sim.jobs[e.for_job].info.queue, sim.jobs[e.job_id].info.queue)
        for plan in sim.plans
        for e in plan.evictions
    ]
    assert directions and {taker for taker, _ in directions} == {"c"}
    running = {
        q: sum(1 for j in sim.jobs.values() if j.info.queue == q and j.started is not None)
        for q in "abc"
    }
    # c took one job's room from a, and that room went to c (its claim): a, now a core below
    # its share, cannot take a job of b's (b would go below its own), and a second c job
    # would take c above its share, so both wait.
    assert running == {"a": 1, "b": 2, "c": 1}
    last = max(i for i, plan in enumerate(sim.plans) if plan.evictions)
    assert last < 6


def test_a_queue_above_its_share_does_not_preempt_back_what_was_reclaimed_from_it() -> None:
    # 5 cores; a (weight 1) and c (weight 1) deserve 1 core each, b (weight 3) 3. j2 of a
    # (4 cores) starts first; c reclaims j2's worker for j1 (2 cores), leaving a at 2 cores,
    # still above its share. c is then above its share too, and a's j2 (priority 2) waits for
    # its worker: preempting j1's (priority 1) would undo the reclaim with nothing changed.
    gang_policy = BasicPolicy.GANG
    sim = Sim(
        [node("n0", cpu=2), node("n1", cpu=3)],
        [queue("a", weight=1), queue("b", weight=3), queue("c", weight=1)],
        stop_cycles=2,
    )
    for job, duration in [
        (gang("j0", workers=1, minimum=0, cpu=2, priority=1, queue="b", policy=gang_policy), 2),
        (
            gang(
                "j1",
                workers=1,
                minimum=0,
                cpu=1,
                priority=1,
                queue="c",
                submit_time=1,
                policy=gang_policy,
            ),
            2,
        ),
        (
            gang(
                "j2",
                workers=1,
                minimum=0,
                cpu=2,
                priority=2,
                queue="a",
                submit_time=2,
                policy=gang_policy,
            ),
            5,
        ),
    ]:
        sim.submit(job, duration)
    sim.run(14)
    taken = [
        (cycle, sim.jobs[e.for_job].info.queue, sim.jobs[e.job_id].info.queue)
        for cycle, plan in enumerate(sim.plans)
        for e in plan.evictions
    ]
    assert taken == [(1, "c", "a")]
    refusals = {(r.action, r.reason) for r in sim.plans[5].refusals if r.job_id == "j2"}
    assert refusals == {("preempt", "OwnQueueNotBelowShare"), ("reclaim", "QueueNotBelowShare")}
    assert all(job.finished is not None for job in sim.jobs.values())
