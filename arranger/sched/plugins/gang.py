"""gang: a job's minimum is placed whole or not at all (the statement makes it so)."""

from __future__ import annotations

from arranger.sched.framework import Plugin, plugin
from arranger.sched.snapshot import JobInfo, PodRequest
from arranger.states import BasicPolicy


@plugin
class Gang(Plugin):
    """Gang: the minimum is the pods marked in_minimum (the leader and minWorkersNum workers),
    or every pending pod but a helper role's (auxiliary) for basicPolicy Gang."""

    name = "gang"

    def open(self) -> None:
        cache: dict[str, list[PodRequest]] = {}

        def minimum(job: JobInfo) -> list[PodRequest]:
            found = cache.get(job.id)
            if found is None:
                every = job.basic_policy == BasicPolicy.GANG
                found = [p for p in job.pending if p.in_minimum or (every and not p.auxiliary)]
                cache[job.id] = found
            return found

        self.session.minimum_of = minimum
