"""preempt and reclaim evict running pods so that waiting gang minimums can be placed.

- preempt: a job whose minimum did not fit may evict pods of lower-priority jobs of its own
  queue, or, while its queue is below its deserved share in a resource the job asks for, of
  queues above theirs in it (the plugins' preemptable rules).
- reclaim: a job of a queue below its deserved share in a resource it asks for may evict pods
  of jobs of queues above theirs in it, whatever their priority (the reclaimable rules).
  Taking from another queue, by either action, must not leave that queue below its deserved
  share in a resource its pods hold while the taker's queue, with the job's minimum placed,
  goes above its own in it (the evictable rules), so two queues never take from each other
  back and forth.

Which victims, and how few: see victims. If no allowed set of victims makes room, nothing is
evicted for the job, and the refusal says why.

Evicted pods hold their resources until they are gone, so preemptors are placed in a later
cycle. Meanwhile each cycle works on a view of the cluster without the pods already stopping
and lets the waiting jobs claim room in that view in job order (a what-if, all discarded at
the end): a preemptor for which stopping pods already make room waits for them and evicts
nothing more, and two preemptors never count on the same room. Room being freed for another
job is claimed only by a job whose queue stays within its deserved share with it (the
claimable rules): otherwise the jobs of a queue could take, unchecked, all the room one of
them reclaimed, and the queue it came from would have to take it back.
"""

from __future__ import annotations

from collections.abc import Iterator

from arranger.sched import reasons
from arranger.sched.actions.room import Room, claim_room
from arranger.sched.actions.victims import (
    Victim,
    candidates,
    mark_evicted,
    minimal,
    victim_class,
)
from arranger.sched.framework import action
from arranger.sched.plan import Eviction, Refusal
from arranger.sched.resources import Res
from arranger.sched.session import Session
from arranger.sched.snapshot import JobInfo, PodRequest, RunningPod
from arranger.sched.statement import Statement


@action("preempt")
def preempt(session: Session) -> None:
    _make_room(session, reclaim=False)


@action("reclaim")
def reclaim(session: Session) -> None:
    _make_room(session, reclaim=True)


def _make_room(session: Session, reclaim: bool) -> None:
    waiting = [j for j in _waiting(session) if j.id not in session.claimed]
    if not any(
        not session.progress[j.id].evicting and _may_take(session, j, reclaim) for j in waiting
    ):
        for job in waiting:  # nobody here may evict anything: the view below would change nothing
            if not session.progress[job.id].evicting:
                _refuse(session, job, reclaim, set(), set())
        return
    view = Statement(session)  # the cluster without the pods already stopping
    scratch: list[Statement] = [view]  # what-ifs undone when this pass ends
    try:
        known = session.nodes.index
        stopping = [(v, p) for v, p in session.terminating if p.node in known]
        stopping += [(v, p) for v, p in _running(session) if (v.id, p.name) in session.evicted]
        for victim, pod in stopping:
            view.release(victim, pod)
        for job in waiting:
            progress = session.progress[job.id]
            minimum = session.minimum(job)
            claim = claim_room(session, job, minimum)
            if claim is not None and not (progress.evicting or job.id in session.claimants):
                why = session.claim_refusal(job)  # room freed for others: only within its share
                if why:
                    claim.discard()
                    progress.why = why
                    continue  # it waits; when the room is free, allocate's turns decide
            if claim is not None:  # room is on its way: claim it and evict nothing more
                session.hold(job, claim)
                if not progress.evicting:
                    stopping_now = len(stopping) + len(session.evicted)
                    progress.why = f"waiting for evicted pods to stop ({stopping_now} stopping)"
                    progress.evicting, progress.code = True, reasons.PREEMPTING
                continue
            if not progress.evicting:
                evict_for(session, job, reclaim, scratch)
    finally:
        for statement in reversed(scratch):
            statement.discard()


def hold_claimed_room(session: Session, job: JobInfo, minimum: list[PodRequest]) -> None:
    """hold_claimed_room: allocate's step for a claimant whose minimum does not fit yet. If it
    fits once its claim's victims still stopping are gone, that room is held for it until the
    cycle ends (as _make_room holds it): victims that end at different times (one checkpoints
    early, another's notice runs on) do not hand the room already free to a job after it,
    the victim itself included, to be evicted again."""
    victims = {
        v for claim in session.snapshot.claims if claim.job_id == job.id for v in claim.victims
    }
    known = session.nodes.index
    stopping = [
        (v, p) for v, p in session.terminating if (v.id, p.name) in victims and p.node in known
    ]
    if not stopping:
        return
    view = Statement(session)
    for victim, pod in stopping:
        view.release(victim, pod)
    try:
        claim = claim_room(session, job, minimum)
    finally:
        view.discard()  # the held claim keeps the room taken while the victims still hold it
    if claim is not None:
        session.hold(job, claim)
        progress = session.progress[job.id]
        progress.why = f"waiting for evicted pods to stop ({len(stopping)} stopping)"
        progress.evicting, progress.code = True, reasons.PREEMPTING


def evict_for(
    session: Session, job: JobInfo, reclaim: bool, scratch: list[Statement] | None = None
) -> None:
    """evict_for chooses, and records in the plan, the evictions that make room for the job's
    minimum (none if no allowed set of victims would). The victims' release is a what-if
    pushed on `scratch` (undone at once without it); the room the job then takes stays
    claimed in the session until the cycle ends, so nobody else takes it meanwhile."""
    progress = session.progress[job.id]
    minimum = session.minimum(job)
    before = session.queue_of(job).allocated
    releases = Statement(session)
    chosen: list[Victim] = []
    released: set[tuple[str, str]] = set()
    claim: Statement | None = None
    room = Room(session, job, minimum)  # kept up to date as victims are released
    index = session.nodes.index
    crossed: set[str] = set()  # victims the evictable rules refused
    protected: set[str] = set()  # victims their queue's minRunSeconds shields
    for victim, unit in candidates(session, job, minimum, reclaim, protected):
        pods = [p for p in unit if (victim.id, p.name) not in released]
        if not pods:
            continue
        if session.evict_refusal(job, victim, Res.total(pods)):
            crossed.add(victim.id)
            continue
        with room.changing({index[pod.node] for pod in pods}):
            for pod in pods:
                releases.release(victim, pod)
                released.add((victim.id, pod.name))
        chosen.append((victim, pods))
        if not room.fits():
            continue  # not even room for each shape on its own: no placement worth trying
        claim = claim_room(session, job, minimum, checked=True)
        if claim is not None:
            break
    if claim is None:  # no set of victims makes room: evict nothing
        releases.discard()
        _refuse(session, job, reclaim, crossed, protected - crossed - {v.id for v, _ in chosen})
        return
    chosen, releases, claim = minimal(session, job, minimum, chosen, releases, claim)
    own = all(victim.queue == job.queue for victim, _ in chosen)
    if own and session.claim_refusal(job, before):  # it would grow past its share on room
        # freed for others (its own victims free only what its queue held)
        claim.discard()
        releases.discard()
        _refuse(session, job, reclaim, {v.id for v, _ in chosen}, set())
        return
    if scratch is None:
        claim.discard()
        releases.discard()
    else:
        scratch.append(releases)
        session.hold(job, claim)
    verb = "reclaimed" if reclaim else "preempted"
    why = f"{verb} by job {job.name} (priority {job.priority}, queue {job.queue})"
    evicted = [(victim, pod) for victim, pods in chosen for pod in pods]
    for victim, pod in evicted:
        mark_evicted(session, victim, pod)
        eviction = Eviction(victim.id, pod.name, pod.node, job.id, why, pod.in_minimum)
        session.plan.evictions.append(eviction)
    progress.evicting = True
    names = sorted({victim.name for victim, _ in chosen})
    progress.why = (
        f"{verb} {len(evicted)} pods of {', '.join(names)}; starts when they have stopped"
    )
    progress.code = reasons.PREEMPTING


def _refuse(
    session: Session, job: JobInfo, reclaim: bool, crossed: set[str], protected: set[str]
) -> None:
    """_refuse records why preempt (or reclaim) evicted nothing for the job: the other running
    jobs counted by the rule that refuses them (`crossed`: those only the evictable rules
    refused; `protected`: those only their queue's minRunSeconds shielded); those every rule
    allows could not make room. The reason is the job-wide one (its queue is not below its
    share), else the evictable rules', else minRunSeconds', else no room when some victim was
    allowed, else the reason refusing the most jobs."""
    counts: dict[str, int] = {}
    for representative, ids in _victim_classes(session).values():
        n = len(ids) - (job.id in ids)
        if n > 0:
            why = session.preempt_refusal(job, representative, reclaim)
            why = why or reasons.EVICTION_MAKES_NO_ROOM
            counts[why] = counts.get(why, 0) + n
    for why, ids in ((reasons.WOULD_CROSS_SHARES, crossed), (reasons.RAN_TOO_BRIEFLY, protected)):
        if ids:
            counts[why] = len(ids)
            left = counts.get(reasons.EVICTION_MAKES_NO_ROOM, 0) - len(ids)
            counts[reasons.EVICTION_MAKES_NO_ROOM] = left
    counts = {why: n for why, n in counts.items() if n > 0}
    order = list(reasons.REFUSED_VICTIMS)
    if not counts:
        code = reasons.NO_VICTIMS
    elif reasons.QUEUE_NOT_BELOW_SHARE in counts:
        counts, code = {}, reasons.QUEUE_NOT_BELOW_SHARE
    elif reasons.PREEMPTION_NOT_TRIED in counts:
        counts, code = {}, reasons.PREEMPTION_NOT_TRIED
    elif crossed:
        code = reasons.WOULD_CROSS_SHARES
    elif protected:
        code = reasons.RAN_TOO_BRIEFLY
    elif reasons.EVICTION_MAKES_NO_ROOM in counts:
        code = reasons.EVICTION_MAKES_NO_ROOM
    else:
        code = min(counts, key=lambda why: (-counts[why], order.index(why)))
    words = ", ".join(
        reasons.REFUSED_VICTIMS[why].format(n=n)
        for why, n in sorted(counts.items(), key=lambda wn: order.index(wn[0]))
    ) or reasons.REFUSED_VICTIMS[code].format(n=0)
    action = "reclaim" if reclaim else "preempt"
    refusal = Refusal(job.id, action, code, words)
    session.progress[job.id].refused.append(refusal)
    session.plan.refusals.append(refusal)


def _victim_classes(session: Session) -> dict[tuple[str, int, bool], tuple[JobInfo, set[str]]]:
    """_victim_classes: the jobs holding pods that are not stopping, by what the preemptable
    rules look at, with one of them to ask the rules about; built once per cycle."""
    if session.victim_classes is None:
        classes: dict[tuple[str, int, bool], tuple[JobInfo, set[str]]] = {}
        for victim in session.snapshot.jobs:
            if any(not p.terminating for p in victim.running):
                classes.setdefault(victim_class(victim), (victim, set()))[1].add(victim.id)
        session.victim_classes = classes
    return session.victim_classes


def _waiting(session: Session) -> list[JobInfo]:
    """_waiting: admitted jobs whose minimum is still not placed, most urgent first: those
    room is being freed for (claimants) before the rest. A job evicted whole whose pods are
    still stopping is not among them: it takes nobody's room before its own is given up
    (as allocate waits for it)."""
    jobs = [
        job
        for job in session.pending_jobs
        if session.progress[job.id].admitted
        and not session.progress[job.id].minimum_placed
        and session.minimum(job)
        and not any(p.terminating and p.in_minimum for p in job.running)
    ]
    return sorted(jobs, key=lambda job: (job.id not in session.claimants, session.job_key(job)))


def _may_take(session: Session, job: JobInfo, reclaim: bool) -> bool:
    """_may_take: the job may evict someone's pods at all (cheap, before the real search):
    the rules allow some class of jobs holding pods, asked about a member other than itself."""
    for members in _running_classes(session).values():
        victim = members[0] if members[0].id != job.id else members[-1]
        if victim.id != job.id and session.preempt_refusal(job, victim, reclaim) is None:
            return True
    return False


def _running_classes(session: Session) -> dict[tuple[str, int, bool], list[JobInfo]]:
    """_running_classes: the jobs holding pods, by _victim_class, with the first two of each
    (one to ask the rules about, and another when the first is the one asking); built once
    per cycle."""
    if session.running_classes is None:
        classes: dict[tuple[str, int, bool], list[JobInfo]] = {}
        for victim in session.snapshot.jobs:
            if victim.running:
                members = classes.setdefault(victim_class(victim), [])
                if len(members) < 2:
                    members.append(victim)
        session.running_classes = classes
    return session.running_classes


def _running(session: Session) -> Iterator[tuple[JobInfo, RunningPod]]:
    for victim in session.snapshot.jobs:
        for pod in victim.running:
            yield victim, pod
