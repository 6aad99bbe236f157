"""priority: the job-order plugin `priority` (DESIGN §4.1): higher spec.priority first, and who
may preempt whom."""

from __future__ import annotations

from arranger.sched.framework import Plugin, plugin
from arranger.sched.snapshot import JobInfo


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
