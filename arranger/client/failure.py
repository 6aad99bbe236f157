"""failure: what the CLI says of a failed job beyond its message: the last lines of the log of
the pod that failed it (`get`, `submit --wait`), and which attempt `logs` shows.

The failing pod is the leader when it ended badly, else the worker that ended badly last. Its
log is read through GetLogs (its newest attempt that has a log, at most TAIL_LINES lines and
TAIL_BYTES bytes, within TAIL_WAIT_S); a log that cannot be read is left out without a word.
The log is the pod's own output, but `get` prints it among the server's words: inert.
"""

from __future__ import annotations

from rich.console import Console

from arranger.client.blocking import Client
from arranger.client.inert import inert
from arranger.v1 import arranger_pb2, job_pb2

TAIL_LINES = 10
TAIL_BYTES = 4096  # the most of those lines printed (their end)
TAIL_WAIT_S = 5.0  # the most a failed job's output waits for its log
ENDED_BADLY = ("Failed", "Lost")


def attempt_shown(chunk: arranger_pb2.LogChunk) -> str:
    """attempt_shown: which attempt of which pod GetLogs shows, as its first chunk says."""
    shown = f"{chunk.pod} attempt {chunk.attempt}"
    if chunk.attempt < chunk.latest_attempt:
        later = f"{chunk.attempt + 1}" if chunk.attempt + 1 == chunk.latest_attempt else ""
        later = later or f"{chunk.attempt + 1}..{chunk.latest_attempt}"
        return f"{shown}, the newest with a log (attempt {later} has none)"
    return f"{shown} of 0..{chunk.latest_attempt}"


def failing_pod(job: job_pb2.TYJob) -> job_pb2.PodStatus | None:
    """failing_pod: the pod whose end failed the job: its leader if that ended badly, else the
    worker that ended badly last; None for a job that did not fail or has no such pod."""
    if job.status.stage != "Failed":
        return None
    leader = job.status.leader
    if leader.state in ENDED_BADLY:
        return leader
    bad = [w for w in job.status.workers if w.state in ENDED_BADLY]
    last: job_pb2.PodStatus | None = max(
        bad, key=lambda w: w.finish_time.ToNanoseconds(), default=None
    )
    return last


def print_failure(client: Client, job: job_pb2.TYJob, out: Console) -> None:
    """print_failure prints the last lines of the failing pod's log of a failed job, headed
    by the pod and attempt; nothing when the job did not fail or the log cannot be read."""
    pod = failing_pod(job)
    if pod is None:
        return
    try:  # bounded in time: a slow agent must not hold up `get`
        chunks = client.log_tail(job.metadata.id, pod.name, TAIL_LINES, TAIL_WAIT_S)
    except Exception:  # unreachable, refused or slow: the message says the rest
        return
    shown, data = f"{pod.name} attempt {pod.attempt}", b""
    for chunk in chunks:
        if chunk.HasField("attempt"):
            shown = f"{chunk.pod} attempt {chunk.attempt}"
        data = (data + chunk.data)[-TAIL_BYTES:]
    lines = data.decode(errors="replace").splitlines()
    if not lines:
        return
    out.print(f"\nlast lines of {inert(shown)}:", markup=False)
    for line in lines:
        out.print(f"  {inert(line)}", markup=False, soft_wrap=True)
