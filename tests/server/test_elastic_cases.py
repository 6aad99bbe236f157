"""Elastic sets and eviction notices where they meet the rest of a job's life: a notice on a
job that ends, a pod under notice that ends on its own, a scale during a notice, a scale that
would end the job, a scale whose write fails. Stimuli in, effects out, the clock injected."""

from __future__ import annotations

import pytest

from arranger.client.specfile import load_job_yaml
from arranger.server.validation import SpecInvalid, parse_job
from tests.server.test_elastic import SPEC


def test_a_leader_named_like_a_worker_the_set_may_grow_to_is_refused() -> None:
    spec = SPEC.replace("name: learner", "name: actors-3")  # actors may grow to 5 workers
    with pytest.raises(SpecInvalid, match=r"spec\.leader\.name: 'actors-3' is also the name"):
        parse_job(load_job_yaml(spec))
    parse_job(load_job_yaml(SPEC.replace("name: learner", "name: actors-5")))  # beyond maxCounts
    parse_job(load_job_yaml(SPEC.replace("name: learner", "name: actors-03")))  # not a pod's
