"""preempt and reclaim evict running pods so that waiting gang minimums can be placed.

- preempt: a job whose minimum did not fit may evict pods of lower-priority jobs of its own
  queue, or, while its queue is below its deserved share, of queues above theirs (the
  plugins' preemptable rules).
- reclaim: a job of a queue below its deserved share may evict pods of jobs of queues above
  theirs, whatever their priority (the reclaimable rules). Taking from another queue, by
  either action, is allowed only if that queue stays at or above its deserved share or the
  taker, with its minimum placed, stays within its own (the evictable rules), so two queues
  never take from each other back and forth.

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

import itertools
from collections.abc import Iterator

import numpy as np

from arranger.sched import reasons
from arranger.sched.framework import action
from arranger.sched.nodes import BoolArray, IntArray
from arranger.sched.placement import groups, ordered, place_all_or_nothing
from arranger.sched.plan import Eviction, Refusal
from arranger.sched.resources import Res
from arranger.sched.session import Session
from arranger.sched.snapshot import GPU_MILLI, JobInfo, PodRequest, RunningPod
from arranger.sched.statement import Statement
from arranger.states import Role


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
                _refuse(session, job, reclaim, set())
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
            claim = _claim(session, job, minimum)
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
    victims = {v for claim in session.snapshot.claims if claim.job_id == job.id
               for v in claim.victims}  # fmt: skip
    known = session.nodes.index
    stopping = [(v, p) for v, p in session.terminating
                if (v.id, p.name) in victims and p.node in known]  # fmt: skip
    if not stopping:
        return
    view = Statement(session)
    for victim, pod in stopping:
        view.release(victim, pod)
    try:
        claim = _claim(session, job, minimum)
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
    releases = Statement(session)
    chosen: list[tuple[JobInfo, list[RunningPod]]] = []
    released: set[tuple[str, str]] = set()
    claim: Statement | None = None
    room = _Room(session, job, minimum)  # kept up to date as victims are released
    index = session.nodes.index
    crossed: set[str] = set()  # victims the evictable rules refused
    for victim, unit in _candidates(session, job, minimum, reclaim):
        pods = [p for p in unit if (victim.id, p.name) not in released]
        if not pods:
            continue
        if session.evict_refusal(job, victim, Res.total(pods)):
            crossed.add(victim.id)
            continue
        for pod in pods:
            releases.release(victim, pod)
            released.add((victim.id, pod.name))
            room.changed(index[pod.node])
        chosen.append((victim, pods))
        if not room.enough():
            continue  # not even room for each shape on its own: no placement worth trying
        claim = _claim(session, job, minimum, checked=True)
        if claim is not None:
            break
    if claim is None:  # no set of victims makes room: evict nothing
        releases.discard()
        _refuse(session, job, reclaim, crossed)
        return
    chosen, releases, claim = _trim(session, job, minimum, chosen, releases, claim)
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
        session.evicted.add((victim.id, pod.name))
        eviction = Eviction(victim.id, pod.name, pod.node, job.id, why, pod.in_minimum)
        session.plan.evictions.append(eviction)
    progress.evicting = True
    names = sorted({victim.name for victim, _ in chosen})
    progress.why = (
        f"{verb} {len(evicted)} pods of {', '.join(names)}; starts when they have stopped"
    )
    progress.code = reasons.PREEMPTING


def _refuse(session: Session, job: JobInfo, reclaim: bool, crossed: set[str]) -> None:
    """_refuse records why preempt (or reclaim) evicted nothing for the job: the other running
    jobs counted by the rule that refuses them (`crossed`: those only the evictable rules
    refused); those every rule allows could not make room. The reason is the job-wide one
    (its queue is not below its share), else the evictable rules', else no room when some
    victim was allowed, else the reason refusing the most jobs."""
    counts: dict[str, int] = {}
    for representative, ids in _victim_classes(session).values():
        n = len(ids) - (job.id in ids)
        if n > 0:
            why = session.preempt_refusal(job, representative, reclaim)
            why = why or reasons.EVICTION_MAKES_NO_ROOM
            counts[why] = counts.get(why, 0) + n
    if crossed:
        counts[reasons.WOULD_CROSS_SHARES] = len(crossed)
        left = counts.get(reasons.EVICTION_MAKES_NO_ROOM, 0) - len(crossed)
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
                classes.setdefault(_victim_class(victim), (victim, set()))[1].add(victim.id)
        session.victim_classes = classes
    return session.victim_classes


def _trim(
    session: Session, job: JobInfo, minimum: list[PodRequest],
    chosen: list[tuple[JobInfo, list[RunningPod]]], releases: Statement, claim: Statement,
) -> tuple[list[tuple[JobInfo, list[RunningPod]]], Statement, Statement]:  # fmt: skip
    """_trim spares the victims the claim did not need: those with no pod on a node the
    preemptor's pods went to. A job taken whole goes or stays whole, with the surplus
    workers taken from it before."""
    used = claim.nodes_used()
    index = session.nodes.index
    whole = {v.id for v, pods in chosen if any(p.in_minimum for p in pods)}
    helped = {v.id for v, pods in chosen if any(index[p.node] in used for p in pods)}
    needed = [
        (v, pods) for v, pods in chosen
        if (v.id in helped if v.id in whole else any(index[p.node] in used for p in pods))
    ]  # fmt: skip
    if len(needed) == len(chosen):
        return chosen, releases, claim
    claim.discard()
    releases.discard()
    releases = _released(session, needed)
    again = _claim(session, job, minimum)
    if again is None:  # it did need them after all (it cannot, but stay safe): take them all
        releases.discard()
        releases = _released(session, chosen)
        again = _claim(session, job, minimum)
        assert again is not None
        return chosen, releases, again
    return needed, releases, again


def _released(session: Session, victims: list[tuple[JobInfo, list[RunningPod]]]) -> Statement:
    """_released: a statement releasing every pod of the victims."""
    releases = Statement(session)
    for victim, pods in victims:
        for pod in pods:
            releases.release(victim, pod)
    return releases


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


def _victim_class(victim: JobInfo) -> tuple[str, int, bool]:
    """_victim_class: what the preemptable rules may look at (the victim's queue, priority and
    opt-out); jobs of one class are all allowed or all refused, so one answer serves all."""
    return (victim.queue, victim.priority, victim.preemptible)


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
                members = classes.setdefault(_victim_class(victim), [])
                if len(members) < 2:
                    members.append(victim)
        session.running_classes = classes
    return session.running_classes


def _running(session: Session) -> Iterator[tuple[JobInfo, RunningPod]]:
    for victim in session.snapshot.jobs:
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
    useful = _useful(session, job, minimum)
    index = session.nodes.index
    surplus, whole = _victim_order(session)
    allowed: dict[tuple[str, int, bool], bool] = {}

    def may(victim: JobInfo) -> bool:
        if victim.id == job.id:
            return False
        kind = _victim_class(victim)
        if kind not in allowed:
            allowed[kind] = session.preempt_refusal(job, victim, reclaim) is None
        return allowed[kind]

    def live(victim: JobInfo, pod: RunningPod) -> bool:
        return not _stopping(session, victim, pod) and pod.node in index

    spare: dict[str, int] = {}  # workers each victim can lose and keep its minimum running
    while session.victim_cursor < len(surplus) and _stopping(
        session, *surplus[session.victim_cursor]
    ):
        session.victim_cursor += 1  # taken by earlier preemptors: skip them for good
    for victim, one in itertools.islice(surplus, session.victim_cursor, None):
        if not (may(victim) and live(victim, one) and useful[index[one.node]]):
            continue
        if victim.id not in spare:
            spare[victim.id] = _spare_workers(session, victim)
        if spare[victim.id] <= 0:
            continue
        spare[victim.id] -= 1
        yield victim, [one]
    for victim in whole:
        if not may(victim):
            continue
        every = [p for p in victim.running if live(victim, p)]  # surplus already taken included
        if any(useful[index[p.node]] for p in every):
            yield victim, every


def _useful(session: Session, job: JobInfo, minimum: list[PodRequest]) -> BoolArray:
    """_useful: the nodes some pod of the minimum may use."""
    useful = np.zeros(len(session.nodes), dtype=np.bool_)
    for wanted in minimum:
        useful |= session.static_mask(wanted, job)
    return useful


def _spare_workers(session: Session, victim: JobInfo) -> int:
    """_spare_workers: running workers beyond the job's minimum. An in-minimum worker that is
    pending (its node was lost) counts as missing: the extras running stand in for it."""

    def live(pod: RunningPod) -> bool:
        return not _stopping(session, victim, pod)

    running = sum(1 for p in victim.running if p.role == Role.WORKER and live(p))
    minimum = sum(1 for p in victim.running if p.role == Role.WORKER and p.in_minimum)
    minimum += sum(1 for p in victim.pending if p.role == Role.WORKER and p.in_minimum)
    return running - minimum


def _victim_order(session: Session) -> tuple[list[tuple[JobInfo, RunningPod]], list[JobInfo]]:
    """_victim_order sorts every running pod and job once per cycle, in the order victims
    are taken; each preemptor then filters it lazily."""
    if session.victim_order is None:
        surplus = [(v, p) for v in session.snapshot.jobs for p in v.running if not p.in_minimum]
        surplus.sort(
            key=lambda vp: (vp[0].priority, -(vp[1].start_time or 0.0), vp[0].id, vp[1].name)
        )
        whole = sorted(
            (v for v in session.snapshot.jobs if v.running),
            key=lambda v: (len(v.running), v.priority, -(v.start_time or 0.0), v.id),
        )
        session.victim_order = (surplus, whole)
    return session.victim_order


def _claim(
    session: Session, job: JobInfo, minimum: list[PodRequest], checked: bool = False
) -> Statement | None:
    """_claim places the minimum tentatively and returns the statement holding it, or None
    when it does not fit (or its queue may not take it). `checked`: the caller already
    knows each shape has room on its own."""
    if session.admit(job, Res.total(minimum)):
        return None
    if not checked and not _Room(session, job, minimum).enough():
        return None
    statement, misfit = place_all_or_nothing(session, job, minimum, explained=False)
    return statement if misfit is None else None


class _Room:
    """_Room answers quickly whether a placement is worth trying: for each pod shape of the
    minimum, do the usable nodes have room for that many pods of it, each node counted on its
    own? A necessary condition only (shapes compete for the same nodes). After a release,
    `changed(node)` updates one node in O(shapes)."""

    def __init__(self, session: Session, job: JobInfo, minimum: list[PodRequest]) -> None:
        self.nodes = session.nodes
        self.shapes = [(group[0], len(group)) for group in groups(ordered(minimum))]
        self.masks = [session.static_mask(pod, job) for pod, _ in self.shapes]
        self.room = [self._room(pod, count, slice(None)) for pod, count in self.shapes]
        self.totals = [int(r[m].sum()) for r, m in zip(self.room, self.masks, strict=True)]

    def _room(self, pod: PodRequest, count: int, at: slice | int) -> IntArray:
        nodes = self.nodes
        room = np.minimum(
            count,
            np.maximum(0, (nodes.alloc_cpu[at] - nodes.used_cpu[at]) // max(pod.cpu_milli, 1)),
        )
        if pod.memory_bytes:
            room = np.minimum(
                room, np.maximum(0, (nodes.alloc_mem[at] - nodes.used_mem[at]) // pod.memory_bytes)
            )
        if pod.gpu_milli >= GPU_MILLI:
            room = np.minimum(room, nodes.free_whole[at] // (pod.gpu_milli // GPU_MILLI))
        elif pod.gpu_milli:
            room = np.minimum(
                room, np.maximum(0, (nodes.alloc_gpu[at] - nodes.used_gpu[at]) // pod.gpu_milli)
            )
        result: IntArray = np.asarray(room, dtype=np.int64)
        return result

    def changed(self, node: int) -> None:
        for i, (pod, count) in enumerate(self.shapes):
            if self.masks[i][node]:
                new = int(self._room(pod, count, node))
                self.totals[i] += new - int(self.room[i][node])
                self.room[i][node] = new

    def enough(self) -> bool:
        return all(
            total >= count for total, (_, count) in zip(self.totals, self.shapes, strict=True)
        )
