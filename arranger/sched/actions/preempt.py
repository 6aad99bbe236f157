"""preempt and reclaim evict running pods so that waiting gang minimums can be placed.

- preempt: a job whose minimum did not fit may evict pods of lower-priority jobs of its own
  queue, or of queues above their deserved share (the plugins' preemptable rules).
- reclaim: a job of a queue below its deserved share may evict pods of jobs of queues above
  theirs, whatever their priority (the reclaimable rules). Neither ever takes a queue below
  its deserved share, so two queues never take from each other back and forth.

Victims, in order: first workers above their job's minimum (lowest priority, then most
recently started first), then whole jobs (fewest pods, lowest priority, most recently
started: least work lost). A job is never cut below its minimum: its minimum goes only with
the whole job. Evicting stops as soon as the preemptor's minimum would fit without the
victims; if it never would, nothing is evicted for it.

Evicted pods hold their resources until they are gone, so preemptors are placed in a later
cycle. Meanwhile each cycle works on a view of the cluster without the pods already stopping
and lets the waiting jobs claim room in that view in job order (a what-if, all discarded at
the end): a preemptor for which stopping pods already make room waits for them and evicts
nothing more, and two preemptors never count on the same room.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from arranger.sched import reasons
from arranger.sched.framework import action
from arranger.sched.placement import groups, ordered, place_all_or_nothing
from arranger.sched.plan import Eviction
from arranger.sched.resources import Res
from arranger.sched.session import Session
from arranger.sched.snapshot import GPU_MILLI, JobInfo, PodRequest, RunningPod
from arranger.sched.statement import Statement


@action("preempt")
def preempt(session: Session) -> None:
    _make_room(session, reclaim=False)


@action("reclaim")
def reclaim(session: Session) -> None:
    _make_room(session, reclaim=True)


def _make_room(session: Session, reclaim: bool) -> None:
    waiting = _waiting(session)
    if not any(
        not session.progress[j.id].evicting and _may_take(session, j, reclaim) for j in waiting
    ):
        return  # nobody here may evict anything: the view below would change nothing
    stack: list[Statement] = []  # what-ifs, undone in reverse at the end
    view = Statement(session)
    stack.append(view)
    try:
        known = session.nodes.index
        stopping = [(v, p) for v, p in session.terminating if p.node in known]
        stopping += [(v, p) for v, p in _running(session) if (v.id, p.name) in session.evicted]
        for victim, pod in stopping:
            view.release(victim, pod)
        for job in waiting:
            progress = session.progress[job.id]
            minimum = session.minimum(job)
            claim = _claim(session, job, minimum)
            if claim is not None:  # room is on its way: claim it and evict nothing more
                stack.append(claim)
                if not progress.evicting:
                    stopping_now = len(stopping) + len(session.evicted)
                    progress.why = f"waiting for evicted pods to stop ({stopping_now} stopping)"
                    progress.evicting, progress.code = True, reasons.PREEMPTING
                continue
            if progress.evicting:
                continue  # evicted for in an earlier pass of this cycle
            evict_for(session, job, reclaim, stack)
    finally:
        for statement in reversed(stack):
            statement.discard()


def evict_for(
    session: Session, job: JobInfo, reclaim: bool, stack: list[Statement] | None = None
) -> None:
    """evict_for chooses, and records in the plan, the evictions that make room for the job's
    minimum (none if no allowed set of victims would). The room it makes stays claimed in the
    session until the statements pushed on `stack` are discarded (at once, without a stack)."""
    own: list[Statement] = []
    progress = session.progress[job.id]
    minimum = session.minimum(job)
    releases = Statement(session)
    own.append(releases)
    chosen: list[tuple[JobInfo, RunningPod]] = []
    claim: Statement | None = None
    for victim, pods in _candidates(session, job, minimum, reclaim):
        if not session.may_evict(job, victim, Res.total(pods)):
            continue
        for pod in pods:
            releases.release(victim, pod)
            chosen.append((victim, pod))
        claim = _claim(session, job, minimum)
        if claim is not None:
            own.append(claim)
            break
    if claim is None:  # no set of victims makes room: evict nothing
        releases.discard()
        return
    if stack is None:
        for statement in reversed(own):
            statement.discard()
    else:
        stack.extend(own)
    verb = "reclaimed" if reclaim else "preempted"
    why = f"{verb} by job {job.name} (priority {job.priority}, queue {job.queue})"
    for victim, pod in chosen:
        session.evicted.add((victim.id, pod.name))
        session.plan.evictions.append(Eviction(victim.id, pod.name, pod.node, job.id, why))
    progress.evicting = True
    names = sorted({victim.name for victim, _ in chosen})
    progress.why = f"{verb} {len(chosen)} pods of {', '.join(names)}; starts when they have stopped"
    progress.code = reasons.PREEMPTING


def _waiting(session: Session) -> list[JobInfo]:
    """_waiting: admitted jobs whose minimum is still not placed, most urgent first."""
    jobs = [
        job
        for job in session.jobs
        if session.progress[job.id].admitted
        and not session.progress[job.id].minimum_placed
        and session.minimum(job)
    ]
    return sorted(jobs, key=session.job_key)


def _victim_class(victim: JobInfo) -> tuple[str, int, bool]:
    """_victim_class: what the preemptable rules may look at (the victim's queue, priority and
    opt-out); jobs of one class are all allowed or all refused, so one answer serves all."""
    return (victim.queue, victim.priority, victim.preemptible)


def _may_take(session: Session, job: JobInfo, reclaim: bool) -> bool:
    """_may_take: the job may evict someone's pods at all (cheap, before the real search)."""
    seen: set[tuple[str, int, bool]] = set()
    for victim in session.jobs:
        if not victim.running or victim.id == job.id or _victim_class(victim) in seen:
            continue
        seen.add(_victim_class(victim))
        if session.may_preempt(job, victim, reclaim):
            return True
    return False


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
    surplus, whole = _victim_order(session)
    allowed: dict[tuple[str, int, bool], bool] = {}

    def may(victim: JobInfo) -> bool:
        if victim.id == job.id:
            return False
        kind = _victim_class(victim)
        if kind not in allowed:
            allowed[kind] = session.may_preempt(job, victim, reclaim)
        return allowed[kind]

    def live(victim: JobInfo, pod: RunningPod) -> bool:
        return not _stopping(session, victim, pod) and pod.node in index

    taken: set[tuple[str, str]] = set()
    for victim, one in surplus:
        if may(victim) and live(victim, one) and useful[index[one.node]]:
            taken.add((victim.id, one.name))
            yield victim, [one]
    for victim in whole:
        if not may(victim):
            continue
        rest = [p for p in victim.running if live(victim, p) and (victim.id, p.name) not in taken]
        if any(useful[index[p.node]] for p in rest):
            yield victim, rest


def _victim_order(session: Session) -> tuple[list[tuple[JobInfo, RunningPod]], list[JobInfo]]:
    """_victim_order sorts every running pod and job once per cycle, in the order victims
    are taken; each preemptor then filters it lazily."""
    if session.victim_order is None:
        surplus = [(v, p) for v in session.jobs for p in v.running if not p.in_minimum]
        surplus.sort(
            key=lambda vp: (vp[0].priority, -(vp[1].start_time or 0.0), vp[0].id, vp[1].name)
        )
        whole = sorted(
            (v for v in session.jobs if v.running),
            key=lambda v: (len(v.running), v.priority, -(v.start_time or 0.0), v.id),
        )
        session.victim_order = (surplus, whole)
    return session.victim_order


def _claim(session: Session, job: JobInfo, minimum: list[PodRequest]) -> Statement | None:
    """_claim places the minimum tentatively and returns the statement holding it, or None
    when it does not fit (or its queue may not take it)."""
    if session.admit(job, Res.total(minimum)) or not _could_fit(session, job, minimum):
        return None
    statement, misfit = place_all_or_nothing(session, job, minimum, explained=False)
    return statement if misfit is None else None


def _could_fit(session: Session, job: JobInfo, minimum: list[PodRequest]) -> bool:
    """_could_fit: a quick necessary check before a full placement: for each pod shape, the
    usable nodes have room for that many pods of it, counting each node on its own."""
    nodes = session.nodes
    for group in groups(ordered(minimum)):
        pod = group[0]
        room = np.full(len(nodes), len(group), dtype=np.int64)
        if pod.cpu_milli:
            room = np.minimum(room, (nodes.alloc_cpu - nodes.used_cpu) // pod.cpu_milli)
        if pod.memory_bytes:
            room = np.minimum(room, (nodes.alloc_mem - nodes.used_mem) // pod.memory_bytes)
        if pod.gpu_milli >= GPU_MILLI:
            room = np.minimum(room, nodes.free_whole // (pod.gpu_milli // GPU_MILLI))
        elif pod.gpu_milli:
            room = np.minimum(room, (nodes.alloc_gpu - nodes.used_gpu) // pod.gpu_milli)
        if int(room[session.static_mask(pod, job)].clip(min=0).sum()) < len(group):
            return False
    return True
