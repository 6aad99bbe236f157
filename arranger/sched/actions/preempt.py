"""preempt and reclaim evict running pods so that a waiting gang minimum can be placed.

- preempt: a job whose minimum did not fit may evict pods of lower-priority jobs of its own
  queue, or of queues above their deserved share (the plugins' preemptable rules).
- reclaim: a job of a queue below its deserved share may evict pods of jobs of queues above
  theirs, whatever their priority (the reclaimable rules). Neither ever takes a queue below
  its deserved share, so two queues never take from each other back and forth.

Victims, in order: first workers above their job's minimum (lowest priority, then most
recently started first), then whole jobs (fewest pods, lowest priority, most recently
started: least work lost). A job is never cut below its minimum: its minimum goes only with
the whole job. Evicting stops as soon as the preemptor's minimum would fit without the
victims (tried with a statement and discarded); if it never would, nothing is evicted.

Evicted pods hold their resources until they are gone, so the preemptor is placed in a later
cycle; while pods already stopping would make room for it, nothing more is evicted for it.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from arranger.sched import reasons
from arranger.sched.framework import action
from arranger.sched.placement import place_all_or_nothing
from arranger.sched.plan import Eviction
from arranger.sched.resources import Res
from arranger.sched.session import Session
from arranger.sched.snapshot import JobInfo, PodRequest, RunningPod
from arranger.sched.statement import Statement


@action("preempt")
def preempt(session: Session) -> None:
    for job in _waiting(session):
        evict_for(session, job, reclaim=False)


@action("reclaim")
def reclaim(session: Session) -> None:
    for job in _waiting(session):
        evict_for(session, job, reclaim=True)


def _waiting(session: Session) -> list[JobInfo]:
    """_waiting: admitted jobs whose minimum is still not placed, most urgent first."""
    jobs = [
        job
        for job in session.jobs
        if session.progress[job.id].admitted
        and not session.progress[job.id].minimum_placed
        and not session.progress[job.id].evicting
        and session.minimum(job)
    ]
    return sorted(jobs, key=session.job_key)


def evict_for(session: Session, job: JobInfo, reclaim: bool) -> None:
    """evict_for chooses, and records in the plan, the evictions that make room for the job's
    minimum (none if no allowed set of victims would)."""
    progress = session.progress[job.id]
    minimum = session.minimum(job)
    what_if = Statement(session)
    known = session.nodes.index
    stopping = [
        (victim, pod)
        for victim, pod in _running(session)
        if _stopping(session, victim, pod) and pod.node in known
    ]
    for victim, pod in stopping:
        what_if.release(victim, pod)
    if _fits(session, job, minimum):
        what_if.discard()
        progress.why = f"waiting for {len(stopping)} evicted pods to stop"
        progress.evicting = True
        return
    chosen: list[tuple[JobInfo, RunningPod]] = []
    for victim, pods in _candidates(session, job, minimum, reclaim):
        if not session.may_evict(job, victim, Res.total(pods)):
            continue
        for pod in pods:
            what_if.release(victim, pod)
            chosen.append((victim, pod))
        if _fits(session, job, minimum):
            break
    else:
        what_if.discard()  # no set of victims makes room: evict nothing
        return
    what_if.discard()  # the victims keep their resources until they are gone
    verb = "reclaimed" if reclaim else "preempted"
    for victim, pod in chosen:
        session.evicted.add((victim.id, pod.name))
        why = f"{verb} by job {job.name} (priority {job.priority}, queue {job.queue})"
        session.plan.evictions.append(Eviction(victim.id, pod.name, pod.node, job.id, why))
    progress.evicting = True
    jobs = sorted({victim.name for victim, _ in chosen})
    progress.why = f"{verb} {len(chosen)} pods of {', '.join(jobs)}; starts when they have stopped"
    progress.code = reasons.PREEMPTING


def _running(session: Session) -> Iterator[tuple[JobInfo, RunningPod]]:
    for victim in session.jobs:
        for pod in victim.running:
            yield victim, pod


def _stopping(session: Session, victim: JobInfo, pod: RunningPod) -> bool:
    return pod.terminating or (victim.id, pod.name) in session.evicted


def _candidates(
    session: Session, job: JobInfo, minimum: list[PodRequest], reclaim: bool
) -> Iterator[tuple[JobInfo, list[RunningPod]]]:
    """_candidates yields what may be evicted, in the order it is taken: one surplus worker at
    a time, then whole jobs (what is left of them). Only pods on nodes the preemptor could use
    are worth taking; a whole job goes if any of its pods is on one."""
    useful = np.zeros(len(session.nodes), dtype=np.bool_)
    for wanted in minimum:
        useful |= session.static_mask(wanted, job)
    index = session.nodes.index

    def helps(pod: RunningPod) -> bool:
        return pod.node in index and bool(useful[index[pod.node]])

    victims = [
        v
        for v in session.jobs
        if v.id != job.id and v.running and session.may_preempt(job, v, reclaim)
    ]
    live = {v.id: [p for p in v.running if not _stopping(session, v, p)] for v in victims}
    surplus = [(v, p) for v in victims for p in live[v.id] if not p.in_minimum and helps(p)]
    surplus.sort(key=lambda vp: (vp[0].priority, -(vp[1].start_time or 0.0), vp[0].id, vp[1].name))
    taken: set[tuple[str, str]] = set()
    for victim, one in surplus:
        taken.add((victim.id, one.name))
        yield victim, [one]
    whole = sorted(
        (v for v in victims if any(helps(p) for p in live[v.id])),
        key=lambda v: (len(live[v.id]), v.priority, -(v.start_time or 0.0), v.id),
    )
    for victim in whole:
        rest = [p for p in live[victim.id] if (victim.id, p.name) not in taken]
        if rest:
            yield victim, rest


def _fits(session: Session, job: JobInfo, minimum: list[PodRequest]) -> bool:
    if session.admit(job, Res.total(minimum)):
        return False
    statement, misfit = place_all_or_nothing(session, job, minimum)
    statement.discard()
    return misfit is None
