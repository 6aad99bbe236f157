"""follow: what `submit --wait` and `run --wait` show while they wait: the learner's log as it
comes, each attempt once from its start (a line on stderr names each attempt after the
first), until the job has ended and its last attempt is read.

An attempt not started yet (Pending, Placed, Launching) has nothing to read: the job is asked
again every POLL_S. A log that cannot be read (its node gone) is passed over; the attempt the
learner is on now is tried again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import BinaryIO

from arranger.client.aio import FINISHED
from arranger.client.blocking import Client
from arranger.client.channel import ArrangerError
from arranger.v1 import job_pb2

POLL_S = 0.5
NOT_STARTED = ("Pending", "Placed", "Launching")


def follow_leader(
    client: Client, job_id: str, out: BinaryIO, say: Callable[[str], None]
) -> job_pb2.TYJob:
    """follow_leader writes the learner's log to `out` until the job ends; returns the job as
    it ended."""
    attempt = 0
    while True:
        job = client.get(job_id)
        leader, ended = job.status.leader, job.status.stage in FINISHED
        if attempt > leader.attempt or (attempt == leader.attempt and leader.state in NOT_STARTED):
            if ended:
                return job
            time.sleep(POLL_S)
            continue
        if attempt > 0:
            say(f"[arranger: {leader.name} attempt {attempt}]")
        try:
            for chunk in client.log_chunks(job_id, "", attempt, follow=True):
                out.write(chunk.data)
                out.flush()
        except ArrangerError:
            if attempt == leader.attempt and not ended:
                time.sleep(POLL_S)  # not there yet, or its node not back yet
                continue
        attempt += 1
