"""order: the job-order plugins, priority and drf (DESIGN §4.1)."""

from __future__ import annotations

from arranger.sched.framework import Plugin, plugin
from arranger.sched.resources import share
from arranger.sched.snapshot import JobInfo
from arranger.states import JobQueuePolicy


@plugin
class Priority(Plugin):
    """Priority: higher spec.priority first. A job may preempt only jobs of lower priority,
    and not those that opted out (`preemptible: false`) at or above the configured priority;
    the opt-out also shields from reclaim."""

    name = "priority"

    def open(self) -> None:
        session = self.session
        floor = session.config.opt_out_min_priority

        def shielded(victim: JobInfo) -> bool:
            return not victim.preemptible and victim.priority >= floor

        session.job_keys.append(lambda job: -job.priority)
        session.preemptable.append(
            lambda job, victim: victim.priority < job.priority and not shielded(victim)
        )
        session.reclaimable.append(lambda job, victim: not shielded(victim))


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
