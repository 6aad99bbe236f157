"""order sorts jobs for a cycle: a total order, so every cycle on the same snapshot agrees."""

from __future__ import annotations

from arranger.sched.snapshot import JobInfo


def job_order_key(job: JobInfo) -> tuple[int, float, str]:
    """job_order_key: higher priority first, then earlier submit, then id."""
    return (-job.priority, job.submit_time, job.id)
