"""stalls: pods that stopped making progress (DESIGN §3; Ray Train's hang detection, per role).

A pod whose role sets `progressTimeoutSeconds` counts as making progress each time it reports
through the in-job SDK (`job.report`, `job.heartbeat`: ReportValues naming the pod). Once it
has reported in its current attempt and then not for that long, it is Stalled: an event of
kind Stalled names it and, of the job's stalled pods, the one whose last report is oldest
("stopped first": in a hung collective, the rank the others wait for), its reason reads `Stalled` (shown
by `get`, the job's message in `list`, and the dashboard) and its role's `onStall` follows:
notify (nothing more), restart (the pod is stopped and restarts, counting a restart) or fail
(the job fails, reason Stalled). A report after that clears the mark (event Progressing).

When each pod last reported is kept in memory only: after a server restart a pod is watched
again from its next report. Pure: the controller calls it from its stimuli and carries out
its Verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from arranger.server.effects import Effects
from arranger.server.model import JobRecord, PodRecord
from arranger.states import PodState

STALLED = "Stalled"  # a stalled pod's reason, and the reason of a job it failed


def stalled(pod: PodRecord) -> bool:
    """stalled: the pod runs and is marked Stalled (its reason, kept with the pod)."""
    return pod.state == PodState.RUNNING and pod.reason == STALLED


def progressed(job: JobRecord, pod: PodRecord, now: float, fx: Effects) -> None:
    """progressed: the pod reported progress now; a Stalled mark is cleared (event)."""
    if pod.state != PodState.RUNNING or pod.stopping:
        return
    pod.progress_at = now
    if pod.reason == STALLED:
        pod.reason = ""
        fx.pods.add(pod.uid)
        fx.jobs.add(job.id)
        fx.event(now, "Progressing", f"{pod.name} reports progress again", job, pod.name)


def due(job: JobRecord) -> float | None:
    """due: the earliest time one of the job's watched pods becomes Stalled, if any."""
    times = [
        pod.progress_at + timeout
        for pod, timeout in _watched(job)
        if pod.progress_at is not None and pod.reason != STALLED
    ]
    return min(times, default=None)


@dataclass
class Verdict:
    """Verdict: what the stalls found now call for: the job to fail (`fail`, its message) or
    pods to stop and restart."""

    fail: str = ""
    restart: list[PodRecord] = field(default_factory=list)


def check(job: JobRecord, now: float, fx: Effects) -> Verdict:
    """check marks the pods whose time without progress has run out as Stalled and tells it;
    what their roles' onStall say is the caller's to do (the Verdict)."""
    watched = [(pod, timeout) for pod, timeout in _watched(job) if pod.progress_at is not None]
    late = sorted(
        (
            pod
            for pod, timeout in watched
            if pod.reason != STALLED and now >= (pod.progress_at or 0.0) + timeout
        ),
        key=lambda p: (p.progress_at or 0.0, p.rank),
    )
    if not late:
        return Verdict()
    # Of the job's pods stalled now or before, the one whose last report is oldest: in a hung
    # collective, the rank the others wait for. Each event names it.
    marked = [pod for pod, _ in watched if pod.reason == STALLED]
    first = min([*marked, *late], key=lambda p: (p.progress_at or 0.0, p.rank))
    stalled_now = len(marked) + len(late)
    for pod in late:
        policy = job.spec.stall_of(pod.worker_set)
        quiet = now - (pod.progress_at or now)
        text = f"{pod.name} reported no progress for {quiet:.0f}s"
        text += f" (progressTimeoutSeconds {policy.timeout_s:g}; onStall: {policy.on_stall})"
        if pod is first and stalled_now > 1:
            text += f"; it stopped first of {stalled_now}"
        elif pod is not first:
            text += f"; {first.name} stopped first"
        pod.reason = STALLED
        fx.pods.add(pod.uid)
        fx.jobs.add(job.id)
        fx.event(now, "Stalled", text, job, pod.name)
    failing = [p for p in late if job.spec.stall_of(p.worker_set).on_stall == "fail"]
    if failing:
        return Verdict(fail=f"{failing[0].name} reported no progress (onStall: fail)")
    return Verdict(
        restart=[p for p in late if job.spec.stall_of(p.worker_set).on_stall == "restart"]
    )


def restarts(job: JobRecord, pod: PodRecord, was_stopping: bool) -> bool:
    """restarts: the attempt that ended was stopped for its stall, with onStall: restart (its
    reason kept with the pod says so, across a server restart): it ends as a failure that
    spends a restart."""
    policy = job.spec.stall_of(pod.worker_set)
    return was_stopping and pod.reason == STALLED and policy.on_stall == "restart"


def _watched(job: JobRecord) -> list[tuple[PodRecord, float]]:
    """_watched: the job's running pods whose role sets progressTimeoutSeconds (a job whose
    roles set none costs no walk over its pods)."""
    spec = job.spec
    timeouts = {"": spec.leader_stall.timeout_s}
    timeouts.update((ws.name, ws.stall.timeout_s) for ws in spec.worker_sets)
    if not job.active or all(t is None for t in timeouts.values()):
        return []
    out = []
    for pod in job.pods.values():
        timeout = timeouts.get(pod.worker_set)
        if timeout is not None and pod.state == PodState.RUNNING and not pod.stopping:
            out.append((pod, timeout))
    return out
