"""build_snapshot: what the scheduling core is told about pods being stopped and ended jobs."""

from __future__ import annotations

from arranger.sched import Plan
from arranger.sched.plan import Eviction
from arranger.server.model import IN_PLACE
from arranger.server.snapshot import build_snapshot
from arranger.states import PodState
from tests.server.test_controller import Harness

GI = 2**30


def test_pods_being_evicted_are_terminating_and_still_use_their_node() -> None:
    h = Harness()
    h.start_all()
    h.c.apply_plan(Plan(evictions=[Eviction("j", "rl-actors-2", "n2", "x", "preempted")]), h.now)
    snap = build_snapshot(h.c, h.now)
    (job,) = snap.jobs
    running = {p.name: p for p in job.running}
    assert running["rl-actors-2"].terminating and not running["rl-actors-1"].terminating
    n2 = next(n for n in snap.nodes if n.name == "n2")
    assert n2.used_cpu_milli == 2000  # actors-1 and the one being stopped (1 core each)


def test_a_pod_stopped_to_run_again_in_place_keeps_its_room() -> None:
    h = Harness()
    h.start_all()
    worker = h.pod("actors-1")
    worker.requeue, worker.stopping = IN_PLACE, True
    (job,) = build_snapshot(h.c, h.now).jobs
    assert not next(p for p in job.running if p.name == "rl-actors-1").terminating


def test_an_ended_job_shows_only_the_pods_it_is_stopping() -> None:
    stopped = Harness(policy="All")
    stopped.start_all()
    stopped.c.stop(stopped.job, stopped.now)
    (job,) = build_snapshot(stopped.c, stopped.now).jobs
    assert job.pending == () and len(job.running) == 4 and all(p.terminating for p in job.running)

    left = Harness(policy="None")
    left.start_all()
    left.report("learner", PodState.SUCCEEDED, exit_code=0)  # the workers run on
    snap = build_snapshot(left.c, left.now)
    assert snap.jobs == ()  # nothing of it to place or to stop
    default = next(q for q in snap.queues if q.name == "default")
    assert default.held_outside.cpu_milli == 3000  # but its running workers count for its queue
    assert sum(n.used_cpu_milli for n in snap.nodes) == 3000
