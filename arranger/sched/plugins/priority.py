"""priority: the job-order plugin `priority` (DESIGN §4.1): higher spec.priority first, and who
may preempt whom."""

from __future__ import annotations

from arranger.sched import reasons
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

        def shielded(victim: JobInfo) -> str | None:
            if not victim.preemptible and victim.priority >= floor:
                return reasons.VICTIM_OPTED_OUT
            return None

        def preemptable(job: JobInfo, victim: JobInfo) -> str | None:
            if victim.priority >= job.priority:
                return reasons.VICTIM_NOT_LOWER_PRIORITY
            return shielded(victim)

        session.job_keys.append(lambda job: -job.priority)
        session.preemptable.append(preemptable)
        session.reclaimable.append(lambda job, victim: shielded(victim))
