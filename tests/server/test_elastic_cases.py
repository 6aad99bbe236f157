"""Elastic sets and eviction notices where they meet the rest of a job's life: a notice on a
job that ends, a pod under notice that ends on its own, a scale during a notice, a scale that
would end the job, a scale whose write fails. Stimuli in, effects out, the clock injected."""

from __future__ import annotations

import pytest

from arranger.client.specfile import load_job_yaml
from arranger.server.snapshot import part_of
from arranger.server.validation import SpecInvalid, parse_job
from arranger.states import PodState, Stage
from tests.server.test_elastic import SPEC, Elastic


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
