"""endings says how a job's pods ended for good, in the words its status and events carry.

A pod whose program can never start (its reason's kind is one of arranger.states.CANNOT_START:
the command is not there, or cannot be run) is not started again: another attempt would fail
the same way. A leader that cannot start fails its job with that kind as the job's reason; a
worker that cannot start spends its set's restarts at once. Pure: the controller asks it.
"""

from __future__ import annotations

from arranger.exits import signal_of
from arranger.server.model import JobRecord, PodRecord
from arranger.states import PodState, cannot_start

REASON_CHARS = 300  # the most of a pod's reason that a job's message or an event repeats


def start_failure(pod: PodRecord) -> str:
    """start_failure: the kind of a failed pod whose program can never start, else ""."""
    return cannot_start(pod.reason) if pod.state == PodState.FAILED else ""


def why_not_started(pod: PodRecord) -> str:
    """why_not_started: "<pod>: cannot start `<command>`: <why>" for such a pod."""
    return f"{pod.name}: {pod.reason.partition(': ')[2]}"


def leader_failure(job: JobRecord) -> tuple[str, str]:
    """leader_failure: the reason and message of a job whose leader ended for good: the kind
    of its start failure, naming the pod and the command, or LeaderFailed."""
    leader = job.leader
    kind = start_failure(leader)
    if kind:
        return kind, why_not_started(leader)
    what = f"{leader.name} ended {leader.state.lower()}{exit_text(leader)}"
    limit = job.spec.restart_limit
    return "LeaderFailed", f"{what} after {job.leader_restarts} restarts (restartLimit {limit})"


def too_few_workers(job: JobRecord, failed: int) -> str:
    """too_few_workers: the message of a job with `failed` workers past their set's
    restartLimit, too many to keep minWorkersNum; it names a worker that cannot start, if any."""
    spec = job.spec
    message = (
        f"{failed} of {spec.num_workers} workers failed past restartLimit "
        f"({spec.restart_limit}); the job needs {spec.required_workers}"
    )
    never = next((w for w in job.workers() if w.done and start_failure(w)), None)
    if never is not None:
        return f"{message}; {why_not_started(never)}"
    ended = [w for w in job.workers() if w.done and w.state != PodState.SUCCEEDED]
    if not ended:
        return message
    last = max(ended, key=lambda w: w.finish_time or 0.0)
    return f"{message}; last {last.name} {last.state.lower()}{exit_text(last)}"


def exit_text(pod: PodRecord) -> str:
    """exit_text: " with exit code N" and what else the pod's reason says, in brackets: the
    signal that ended it ("exit code 143 (SIGTERM)"), and a reason beyond the code
    ("OOMKilled", "ImagePullFailed: ...", at most REASON_CHARS of it); " (reason)" when the
    code is unknown."""
    reason = pod.reason[:REASON_CHARS]
    if pod.exit_code is None:
        return f" ({reason})" if reason else ""
    said = [name] if (name := signal_of(pod.exit_code)) else []
    if reason and reason != f"exit code {pod.exit_code}" and not reason.startswith("killed by "):
        said.append(reason)
    return f" with exit code {pod.exit_code}" + (f" ({'; '.join(said)})" if said else "")
