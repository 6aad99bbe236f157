"""drf: the job-order plugin `drf` (DESIGN §4.1): among jobs asking DRF, the smallest dominant
share first, the share moving with every pod placed in the cycle (as Volcano's does)."""

from __future__ import annotations

from arranger.sched.framework import Plugin, plugin
from arranger.sched.resources import Res, share
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
        placed: dict[str, Res] = {}  # what each DRF job took (or gave back) in this cycle

        def key(job: JobInfo) -> float:
            if job.job_queue_policy != JobQueuePolicy.DRF:
                return 0.0
            more = placed.get(job.id)
            return share(job.allocated if more is None else job.allocated + more, total)

        def allocated(job: JobInfo, request: Res, node: int, sign: int) -> None:
            if job.job_queue_policy == JobQueuePolicy.DRF:
                before = placed.get(job.id)
                taken = request if sign > 0 else request.scaled(-1)
                placed[job.id] = taken if before is None else before + taken

        self.session.job_keys.append(key)
        if any(j.job_queue_policy == JobQueuePolicy.DRF for j in self.session.pending_jobs):
            self.session.on_allocate.append(allocated)
