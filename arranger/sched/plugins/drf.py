"""drf: the job-order plugin `drf` (DESIGN §4.1): among jobs asking DRF, the smallest dominant
share first."""

from __future__ import annotations

from arranger.sched.framework import Plugin, plugin
from arranger.sched.resources import share
from arranger.sched.snapshot import JobInfo
from arranger.states import JobQueuePolicy


@plugin
class Drf(Plugin):
    """Drf: among jobs asking DRF, the one holding the smallest dominant share goes first
    (the largest of allocated/cluster total over cpu, memory and GPUs). Jobs asking Priority
    get 0 here, so with every priority equal DRF is pure DRF."""

    name = "drf"

    def open(self) -> None:
        total = self.session.total

        def key(job: JobInfo) -> float:
            if job.job_queue_policy != JobQueuePolicy.DRF:
                return 0.0
            return share(job.allocated, total)

        self.session.job_keys.append(key)
