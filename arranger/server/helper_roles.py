"""helper_roles: worker sets marked `auxiliary` (a replay buffer, an evaluator, an inference
server beside a learner and its actors; SkyPilot's job groups, TorchX's roles).

An auxiliary set is placed with the job's pods but is never in its gang minimum nor counted in
minWorkersNum (arranger.spec.minimum_ranks, counted_workers), and its failures spend its own
restarts and never fail the job (TooFewWorkers counts the other sets). Once the leader has
ended (succeeded, or failed for good), nothing starts or restarts any more: the other workers
are stopped at once, and each auxiliary set's running workers get its terminationDelaySeconds
from the leader's end (an evaluator finishes its last pass) before they are stopped; the job
then ends as the leader decided. A set with `startAfter: leaderReady` starts only once the
leader has reported (job.report, job.heartbeat) in its current attempt. Pure.
"""

from __future__ import annotations

from arranger.server.effects import Effects
from arranger.server.model import JobRecord, PodRecord
from arranger.server.scaling import PodSteps
from arranger.states import CleanPodPolicy, PodState

LEADER_ENDED = "LeaderEnded"  # the reason a worker is stopped for once its leader has ended


def leader_ended(job: JobRecord) -> bool:
    """leader_ended: the leader succeeded or failed for good: the job only winds down."""
    leader = job.leader
    return leader.state == PodState.SUCCEEDED or (leader.done and leader.state.terminal)


def deadlines(job: JobRecord) -> list[float]:
    """deadlines: when each auxiliary set with running workers not yet stopped is to be
    stopped, once the leader has ended (none before, or once none is left to stop)."""
    ended = job.leader.finish_time
    if not job.active or ended is None or not leader_ended(job):
        return []
    sets = {p.worker_set for p in job.workers() if p.live and not p.done}
    return [
        ended + ws.termination_delay_s
        for ws in job.spec.worker_sets
        if ws.auxiliary and ws.name in sets
    ]


def winds_down(steps: PodSteps, job: JobRecord, now: float, fx: Effects) -> bool:
    """winds_down: after the leader's end, whether the job must still wait for auxiliary
    workers within their delay. While it must, what is not to run on is stopped now (the
    workers of other sets, an auxiliary set's past its delay) as cleanPodPolicy says; when
    it need not, nothing is done here (the job's end stops the rest)."""
    ended = job.leader.finish_time if job.leader.finish_time is not None else now
    waiting = {
        pod.uid
        for pod in job.workers()
        if pod.live and job.spec.is_auxiliary(pod.worker_set) and now < ended + _delay(job, pod)
    }
    if not waiting:
        return False
    for pod in job.workers():
        if pod.uid not in waiting:
            _stop(steps, job, pod, now, fx)
    return True


def _delay(job: JobRecord, pod: PodRecord) -> float:
    ws = job.spec.worker_set(pod.worker_set)
    return ws.termination_delay_s if ws is not None else 0.0


def may_start(job: JobRecord, pod: PodRecord) -> bool:
    """may_start: the pod's set need not wait for its leader to report (startAfter)."""
    ws = job.spec.worker_set(pod.worker_set)
    return ws is None or ws.start_after != "leaderReady" or job.leader.progress_at is not None


def _stop(steps: PodSteps, job: JobRecord, pod: PodRecord, now: float, fx: Effects) -> None:
    """_stop: a worker that is not to run again now that its leader has ended, stopped as the
    job's end would stop it (cleanPodPolicy: None lets it finish)."""
    if pod.done:  # stopped already, or never to run again
        return
    pod.done = True
    fx.pods.add(pod.uid)
    policy = job.spec.clean_pod_policy
    if pod.state in (PodState.PENDING, PodState.PLACED):
        pod.state, pod.reason = PodState.KILLED, LEADER_ENDED
    elif pod.live and not pod.stopping and policy != CleanPodPolicy.NONE:
        steps.kill(pod, LEADER_ENDED, policy == CleanPodPolicy.ALL, fx)
        fx.event(now, "Stopping", f"{pod.name}: its leader has ended", job, pod.name)
