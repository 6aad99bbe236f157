"""follow: what `submit --wait` and `run --wait` show while they wait: the learner's log as it
comes, each attempt once from its start (a line on stderr names each attempt after the
first), until the job has ended and its last attempt is read.

An attempt not started yet (Pending, Placed, Launching) has nothing to read: the job is asked
again every POLL_S. A log that cannot be read (its node gone) is passed over; the attempt the
learner is on now is tried again, from where it was (what was written is not written again),
and one it has left TRIES times.
A job whose pods outlive it (cleanPodPolicy None) is not followed: its learner's log may not
end with it (`submit_spec` waits for the job alone).
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
TRIES = 3  # reads of an attempt the learner has left, before it is passed over
NOT_STARTED = ("Pending", "Placed", "Launching")


def follow_leader(
    client: Client, job_id: str, out: BinaryIO, say: Callable[[str], None]
) -> job_pb2.TYJob:
    """follow_leader writes the learner's log to `out` until the job ends; returns the job as
    it ended."""
    attempt, shown = 0, 0  # bytes of this attempt's log written: a read again skips them
    failed = 0  # reads of this attempt that failed
    while True:
        job = client.get(job_id)
        leader, ended = job.status.leader, job.status.stage in FINISHED
        if attempt > leader.attempt or (attempt == leader.attempt and leader.state in NOT_STARTED):
            if ended:
                return job
            time.sleep(POLL_S)
            continue
        if attempt > 0 and not shown:
            say(f"[arranger: {leader.name} attempt {attempt}]")
        try:
            read = 0
            for chunk in client.log_chunks(job_id, "", attempt, follow=True):
                data = chunk.data[max(0, shown - read) :]
                read += len(chunk.data)
                if data:
                    out.write(data)
                    out.flush()
                    shown += len(data)
        except ArrangerError:
            failed += 1
            if (attempt == leader.attempt and not ended) or failed < TRIES:
                time.sleep(POLL_S)  # not there yet, or its node not back yet
                continue
        attempt, shown, failed = attempt + 1, 0, 0
