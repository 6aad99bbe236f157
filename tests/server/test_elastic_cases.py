"""Elastic sets and eviction notices where they meet the rest of a job's life: a notice on a
job that ends, a pod under notice that ends on its own, a learner that must move during its
job's notice, a preemptor that no longer needs the room, a scale during a notice, a scale that
would end the job, a scale whose write fails or that a plan's eviction overtakes. Stimuli in,
effects out, the clock injected."""

from __future__ import annotations

import copy

import pytest

from arranger.client.specfile import load_job_yaml
from arranger.sched import run_cycle
from arranger.server.rollback import roll_back
from arranger.server.scaling import scale_problem
from arranger.server.snapshot import build_snapshot, part_of
from arranger.server.store import StoredRecords
from arranger.server.validation import SpecInvalid, parse_job
from arranger.states import PodState, Stage
from tests.server.test_elastic import SPEC, Cluster, Elastic


def test_a_leader_named_like_a_worker_the_set_may_grow_to_is_refused() -> None:
    spec = SPEC.replace("name: learner", "name: actors-3")  # actors may grow to 5 workers
    with pytest.raises(SpecInvalid, match=r"spec\.leader\.name: 'actors-3' is also the name"):
        parse_job(load_job_yaml(spec))
    parse_job(load_job_yaml(SPEC.replace("name: learner", "name: actors-5")))  # beyond maxCounts
    parse_job(load_job_yaml(SPEC.replace("name: learner", "name: actors-03")))  # not a pod's


@pytest.mark.parametrize("end", ["stop", "leader succeeds"])
def test_a_job_that_ends_under_notice_with_clean_pod_policy_none_frees_nothing_for_others(
    end: str,
) -> None:
    e = Elastic(SPEC.replace("minWorkersNum: 2", "minWorkersNum: 2\n  cleanPodPolicy: None"))
    e.start()
    e.evict("actors-0")  # the whole job is told
    if end == "stop":
        e.c.stop(e.job, e.now)
    else:
        e.report("learner", PodState.SUCCEEDED)
    assert e.job.stage == Stage.SUCCEEDED
    # Its processes run on (cleanPodPolicy None): none of their room is on its way.
    part = part_of(e.job)
    live = sum(1 for p in e.job.pods.values() if p.live)
    assert part.info is None and part.outside.cpu_milli == 1000 * live > 0
    assert all(p.evict_at is None for p in e.job.pods.values())
    assert e.c.timer("j") is None and not e.c.tick(e.now + 60).kills


@pytest.mark.parametrize("how", ["drained", "node lost", "crashed"])
def test_a_surplus_worker_whose_attempt_ends_under_notice_is_not_evicted_again_later(
    how: str,
) -> None:
    e = Elastic()
    e.c.node_timeout_s = 10.0
    e.start()
    e.scale("actors", 3)
    e.place("actors-2", node="n2")
    e.report("actors-2", PodState.RUNNING)
    e.evict("actors-2")
    assert e.pod("actors-2").evict_at == e.now + 20
    if how == "drained":
        e.c.drain("n2", e.now)
        e.report("actors-2", PodState.KILLED)
        e.c.cordon("n2", False, e.now)
    elif how == "node lost":
        e.c.seen("n1", e.now)
        e.now += 5
        e.c.check_nodes(e.now)  # n2 was last heard from at 0
    else:
        e.report("actors-2", PodState.FAILED)
    pod = e.pod("actors-2")
    assert pod.evict_at is None  # the attempt under notice is over: so is its notice
    e.now += 1
    if pod.state == PodState.PENDING:
        e.place("actors-2", node="n1")
    else:
        e.c.tick(e.now)  # its restart back-off has passed: it is launched where it was
    e.report("actors-2", PodState.RUNNING)
    info = part_of(e.job).info
    assert info is not None and not any(p.terminating for p in info.running)
    fx = e.c.tick(e.now + 20)
    assert not fx.kills and not any(ev.kind == "NoticeEnded" for ev in fx.events)
    assert e.pod("actors-2").state == PodState.RUNNING


def test_a_surplus_worker_under_notice_that_a_scale_puts_in_the_minimum_keeps_running() -> None:
    e = Elastic()
    e.start()
    e.evict("evals-0")  # surplus: only it is told
    assert not e.pod("evals-0").in_minimum and e.pod("evals-0").evict_at is not None
    e.scale("actors", 1)  # minWorkersNum 2 of 2 wanted: evals-0 is in the minimum now
    e.report("actors-1", PodState.KILLED)
    evals = e.pod("evals-0")
    assert evals.in_minimum and evals.evict_at is None  # the notice is withdrawn
    fx = e.c.tick(e.now + 20)
    assert not fx.kills and evals.state == PodState.RUNNING and e.job.stage == Stage.RUNNING


def test_a_scale_down_that_would_leave_too_few_workers_alive_is_refused() -> None:
    e = Elastic(SPEC.replace("minWorkersNum: 2", "minWorkersNum: 2\n  restartLimit: 0"))
    e.start()
    e.scale("evals", 0)
    e.report("evals-0", PodState.KILLED)
    e.scale("actors", 3)
    e.place("actors-2", node="n2")
    e.report("actors-2", PodState.RUNNING)
    e.report("actors-1", PodState.FAILED)  # no restarts: it failed for good
    assert e.job.stage == Stage.RUNNING
    problem = scale_problem(e.job, "actors", 2)  # would keep actors-0 and the failed actors-1
    assert problem is not None and problem[0] == "FAILED_PRECONDITION"
    assert "failed" in problem[1] and "minWorkersNum (2)" in problem[1]
    assert scale_problem(e.job, "actors", 3) is None


def test_a_scale_up_whose_write_failed_leaves_no_added_worker_in_memory() -> None:
    e = Elastic()
    e.start()
    stored = StoredRecords(
        jobs={e.job.id: copy.deepcopy(e.job)},
        pods={p.uid: copy.deepcopy(p) for p in e.job.pods.values()},
    )
    before = list(e.job.pods)
    fx = e.scale("actors", 4)
    roll_back(e.c, fx, stored)
    assert e.job.spec.worker_set("actors").counts == 2  # type: ignore[union-attr]
    assert list(e.job.pods) == before
    info = part_of(e.job).info
    assert info is None or not info.pending  # nothing unwanted waits for a node


def test_a_whole_job_notice_whose_learner_must_move_is_carried_out_at_once() -> None:
    e = Elastic()
    e.place("learner", node="n2")
    e.place("actors-0", "actors-1", "evals-0", node="n1")
    e.report("learner", PodState.RUNNING, rpc=7000)
    for name in ("actors-0", "actors-1", "evals-0"):
        e.report(name, PodState.RUNNING)
    e.evict("actors-0")  # the whole job is told
    e.c.drain("n2", e.now)
    fx = e.report("learner", PodState.KILLED)  # the learner that would checkpoint is gone
    assert e.job.stage == Stage.PENDING and e.job.reason == "Preempted"
    assert sorted(k.pod_uid for k in fx.kills) == ["j/rl-actors-0", "j/rl-actors-1", "j/rl-evals-0"]
    assert all(p.evict_at is None for p in e.job.pods.values())
    for name in ("actors-0", "actors-1", "evals-0"):
        e.report(name, PodState.KILLED)
    assert all(p.state == PodState.PENDING for p in e.job.pods.values())  # room is free now
    assert e.c.timer("j") is None


HIGH = """
metadata: {name: NAME}
spec:
  priority: 9
  minWorkersNum: 4
  leader: {name: l, template: {command: [l], resources: {cpu: 1}}}
  workerSets: [{name: a, counts: 4, template: {command: [a], resources: {cpu: 1}}}]
"""


def test_a_surplus_worker_a_plan_evicts_after_a_scale_put_it_in_the_minimum_keeps_running() -> None:
    cluster = Cluster()
    low = cluster.submit("low", SPEC.replace("name: rl", "name: NAME"))
    cluster.cycle()
    cluster.submit("high", HIGH)  # needs one core more than is free: the surplus evals-0's
    cluster.now += 1
    plan = run_cycle(build_snapshot(cluster.c, cluster.now))
    assert [(e.pod, e.in_minimum) for e in plan.evictions] == [("low-evals-0", False)]
    # While the cycle ran, the learner scaled its actors down: evals-0 is in the minimum now.
    cluster.answer(cluster.c.scale(low, "actors", 1, cluster.now))
    assert low.pods["low-evals-0"].in_minimum
    fx = cluster.c.apply_plan(plan, cluster.now)
    assert not fx.kills and all(p.evict_at is None for p in low.pods.values())
    assert low.stage == Stage.RUNNING


FILLER = """
metadata: {name: NAME}
spec:
  priority: 10
  minWorkersNum: 3
  leader: {name: l, template: {command: [l], resources: {cpu: 1}}}
  workerSets: [{name: a, counts: 3, template: {command: [a], resources: {cpu: 1}}}]
"""
ONE = """
metadata: {name: NAME}
spec:
  priority: 9
  leader: {name: l, template: {command: [l], resources: {cpu: 1}}}
"""
SMALL = (
    ONE + "  workerSets: [{name: a, counts: 2, template: {command: [a], resources: {cpu: 1}}}]\n"
)


@pytest.mark.parametrize("why", ["the preemptor is deleted", "room came free elsewhere"])
def test_a_notice_whose_preemptor_no_longer_needs_the_room_is_withdrawn(why: str) -> None:
    cluster = Cluster()
    low = cluster.submit("low", SPEC.replace("name: rl", "name: NAME"))  # n1's 4 cores
    cluster.cycle()
    filler = cluster.submit("filler", FILLER)  # n2's 4 cores, above anyone's priority
    cluster.cycle()
    if why == "the preemptor is deleted":
        high = cluster.submit("high", ONE)  # one core: the surplus evals-0's
        cluster.cycle(1)
        noticed = ["low-evals-0"]
        cluster.answer(cluster.c.delete(high, cluster.now))
    else:
        cluster.submit("high", SMALL)  # three cores: low's whole job
        cluster.cycle(1)
        noticed = list(low.pods)
        cluster.answer(cluster.c.stop(filler, cluster.now))
    assert [p.name for p in low.pods.values() if p.evict_at is not None] == noticed
    cluster.now += 1
    fx = cluster.c.apply_plan(run_cycle(build_snapshot(cluster.c, cluster.now)), cluster.now)
    cluster.answer(fx)
    assert all(p.evict_at is None for p in low.pods.values())
    assert any(ev.kind == "NoticeWithdrawn" for ev in fx.events)
    cluster.now += 30  # past the notice once given
    cluster.cycle()
    assert all(p.state == PodState.RUNNING and p.attempt == 0 for p in low.pods.values())
    assert low.stage == Stage.RUNNING
