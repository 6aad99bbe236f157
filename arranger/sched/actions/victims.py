"""victims: which running pods preempt and reclaim may take for a waiting job, in what order,
and the smallest set of them that makes room.

Order (`candidates`): first workers above their job's minimum, one at a time (lowest
priority, then most recently started first), then whole jobs (fewest pods, lowest priority,
least work lost: the freshest confirmed checkpoint or, without one, the latest start). For
reclaim the queue most above its deserved share, in the resources the job lacks, gives first
within each of the two tiers. A job is never cut below its minimum: its minimum goes only with
the whole job. Pods of a queue with `minRunSeconds` that have run less than that are not
taken.

Enough (`minimal`): once the victims taken in that order make room, every victim whose
eviction is not needed is spared, the costliest to evict tried first (whole jobs, the most
pods, highest priority and most work first; then surplus workers, highest priority and oldest
first). A victim is spared when the minimum still fits with its pods put back and every
taking across queues still passes the evictable rules; a job taken whole may keep its minimum
when its surplus workers are enough. Sparing a victim of another queue may make a taking fair
that was not, so the victims left are tried again after it; what is left is a set from which
no victim can be spared.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import numpy as np

from arranger.sched.actions.room import Room, claim_room
from arranger.sched.nodes import BoolArray
from arranger.sched.resources import Res, ratio
from arranger.sched.session import Session
from arranger.sched.snapshot import JobInfo, PodRequest, RunningPod
from arranger.sched.statement import Statement
from arranger.states import Role

Victim = tuple[JobInfo, list[RunningPod]]


def candidates(
    session: Session,
    job: JobInfo,
    minimum: list[PodRequest],
    reclaim: bool,
    protected: set[str],
) -> Iterator[Victim]:
    """candidates yields what may be evicted, in the order it is taken: one surplus worker at
    a time, then whole jobs (what is left of them). Only pods on nodes the preemptor could use
    are worth taking; a whole job goes if any of its pods is on one. Jobs the preemptable rules
    refuse are skipped; those only their queue's minRunSeconds shields are added to
    `protected` (and the session learns when the first of them stops being shielded)."""
    useful = _useful(session, job, minimum)
    index = session.nodes.index
    surplus, whole = _victim_order(session)
    allowed: dict[tuple[str, int, bool], bool] = {}

    def may(victim: JobInfo) -> bool:
        if victim.id == job.id:
            return False
        kind = victim_class(victim)
        if kind not in allowed:
            allowed[kind] = session.preempt_refusal(job, victim, reclaim) is None
        return allowed[kind]

    def live(victim: JobInfo, pod: RunningPod) -> bool:
        return not stopping(session, victim, pod) and pod.node in index

    def young(victim: JobInfo, started: float | None) -> bool:
        until = _shielded_until(session, victim, started)
        if until is None:
            return False
        protected.add(victim.id)
        if session.protected_until is None or until < session.protected_until:
            session.protected_until = until
        return True

    cursors = session.victim_cursors  # those before are stopping: skip them for good
    while cursors[0] < len(surplus) and stopping(session, *surplus[cursors[0]]):
        cursors[0] += 1
    while cursors[1] < len(whole) and all(
        stopping(session, whole[cursors[1]], p) for p in whole[cursors[1]].running
    ):
        cursors[1] += 1
    first: Iterable[tuple[JobInfo, RunningPod]] = itertools.islice(surplus, cursors[0], None)
    rest: Iterable[JobInfo] = itertools.islice(whole, cursors[1], None)
    if reclaim:
        first, rest = _most_over_first(session, job, minimum, list(first), list(rest))
    taken: dict[str, int] = {}  # surplus workers of each victim yielded here
    for victim, one in first:
        if not (may(victim) and live(victim, one) and useful[index[one.node]]):
            continue
        if young(victim, one.start_time):
            continue
        if spare_workers(session, victim) - taken.get(victim.id, 0) <= 0:
            continue
        taken[victim.id] = taken.get(victim.id, 0) + 1
        yield victim, [one]
    for victim in rest:
        if not may(victim):
            continue
        every = [p for p in victim.running if live(victim, p)]  # surplus already taken included
        if any(useful[index[p.node]] for p in every) and not young(victim, victim.start_time):
            yield victim, every


def _shielded_until(session: Session, victim: JobInfo, started: float | None) -> float | None:
    """_shielded_until: when a pod (or job) of `victim` that started at `started` has run its
    queue's minRunSeconds, if that is still to come; None: it may be taken now."""
    least = session.queue_of(victim).info.min_run_s
    if least <= 0 or started is None or started + least <= session.now:
        return None
    return started + least


def _most_over_first(
    session: Session,
    job: JobInfo,
    minimum: list[PodRequest],
    surplus: list[tuple[JobInfo, RunningPod]],
    whole: list[JobInfo],
) -> tuple[list[tuple[JobInfo, RunningPod]], list[JobInfo]]:
    """_most_over_first reorders each tier so that the queue most above its deserved share in
    the resources the job asks for gives first (the order within a queue kept)."""
    asked = [i for i, amount in enumerate(Res.total(minimum).as_tuple()) if amount > 0]

    def over(victim: JobInfo) -> float:
        queue = session.queue_of(victim)
        held, deserved = queue.allocated.as_tuple(), queue.deserved.as_tuple()
        return max((ratio(held[i], deserved[i]) for i in asked), default=0.0)

    return (
        sorted(surplus, key=lambda vp: -over(vp[0])),
        sorted(whole, key=lambda v: -over(v)),
    )


def minimal(
    session: Session,
    job: JobInfo,
    minimum: list[PodRequest],
    chosen: list[Victim],
    releases: Statement,
    claim: Statement,
) -> tuple[list[Victim], Statement, Statement]:
    """minimal spares every victim the claim does not need (see the module's docstring). It
    takes the chosen victims with `releases` (their pods released) and `claim` (the minimum
    placed) applied, and returns the victims kept with fresh statements for them, applied."""
    every = _units(chosen)
    if len(every) == 1 and not _mixed(every[0]):
        return chosen, releases, claim
    # First, in one go, the victims with no pod on a node the claim uses (most of them, when
    # the victims were taken across the cluster): the claim stands without them unless the
    # queue's capability or the shares needed them.
    used = claim.nodes_used()
    claim.discard()
    index = session.nodes.index
    units = [u for u in every if any(index[p.node] in used for p in u[1])]
    room: Room | None = None
    if len(units) < len(every):
        releases.discard()
        releases = released(session, units)
        room = Room(session, job, minimum)
        if not (_still_allowed(session, job, units) and _fits(session, job, minimum, room)):
            releases.discard()
            releases = released(session, every)
            units, room = every, None
    if len(units) > 1 or (units and _mixed(units[0])):
        last = chosen[-1][1][-1]  # a pod of the victim taken last: without it nothing fit
        room = room or Room(session, job, minimum)
        units, releases = _spare_one_by_one(session, job, minimum, last, units, releases, room)
    again = claim_room(session, job, minimum, checked=True)
    if again is None:  # only if a count called exact was not: keep every victim
        releases.discard()
        units, releases = every, released(session, every)
        again = claim_room(session, job, minimum)
        assert again is not None, "the same cluster took the minimum a moment ago"
    return units, releases, again


def _spare_one_by_one(
    session: Session,
    job: JobInfo,
    minimum: list[PodRequest],
    last: RunningPod,
    units: list[Victim],
    releases: Statement,
    room: Room,
) -> tuple[list[Victim], Statement]:
    """_spare_one_by_one tries sparing each victim, the costliest first, keeping it spared
    when the minimum still fits without it and the takings across queues stay fair. A job
    taken whole that cannot be spared may still keep its minimum, its surplus workers going
    (then each of them is tried too). Sparing a victim of another queue may make takings fair
    that were not: the victims left are then tried again. `room` counts the cluster with
    `releases` applied; the victim with pod `last` is not tried whole. Returns the victims
    kept and a fresh statement releasing them, applied."""
    index = session.nodes.index
    kept = list(units)
    spared: list[Statement] = []

    def spare(unit: Victim, pods: list[RunningPod], rest: list[Victim]) -> bool:
        """spare puts `pods` of the unit back for good if the minimum still fits and the
        takings of `rest` (what stays evicted) stay fair."""
        back = Statement(session)
        nodes = {index[pod.node] for pod in pods}
        with room.changing(nodes):
            for pod in pods:
                back.restore(unit[0], pod)
        if _fits(session, job, minimum, room) and _still_allowed(session, job, rest):
            spared.append(back)
            return True
        with room.changing(nodes):
            back.discard()
        return False

    def one_pass(tried: list[Victim]) -> bool:
        """one_pass tries each unit; True if it spared one of another queue, or kept a job's
        minimum: then takings that were unfair may be fair, and a pass more is worth it."""
        fairer = False
        for unit in tried:
            victim, pods = unit
            others = [u for u in kept if u is not unit]
            if last not in pods and spare(unit, pods, others):
                kept.remove(unit)
                fairer |= victim.queue != job.queue
                continue
            least = [p for p in pods if p.in_minimum]
            extra = [(victim, [p]) for p in pods if not p.in_minimum]
            if not least or not 0 < len(extra) <= spare_workers(session, victim):
                continue  # (workers standing in for a pending one of the minimum stay)
            if any(_shielded_until(session, victim, p.start_time) for p in pods):
                continue  # minRunSeconds: a young worker goes with its job only
            if not spare(unit, least, [*others, *extra]):
                continue
            fairer = True
            at = kept.index(unit)
            kept[at : at + 1] = extra
            for one in reversed(extra):
                if spare(one, one[1], [u for u in kept if u is not one]):
                    kept.remove(one)
        return fairer

    again = True
    while again:  # a pass goes on only after one that spared pods: it ends
        again = one_pass(list(reversed(kept)))
    for back in reversed(spared):
        back.discard()
    releases.discard()
    return kept, released(session, kept)


def _fits(session: Session, job: JobInfo, minimum: list[PodRequest], room: Room) -> bool:
    """_fits: the minimum would be placed now: counted where the count is exact, else by a
    trial placement (undone)."""
    if not room.fits():
        return False
    if room.exact:
        return session.admit(job, Res.total(minimum)) is None
    attempt = claim_room(session, job, minimum, checked=True)
    if attempt is None:
        return False
    attempt.discard()
    return True


def _mixed(unit: Victim) -> bool:
    """_mixed: the unit is a job taken whole with surplus workers (it may keep its minimum)."""
    return any(p.in_minimum for p in unit[1]) and not all(p.in_minimum for p in unit[1])


def _still_allowed(session: Session, job: JobInfo, victims: list[Victim]) -> bool:
    """_still_allowed: the evictable rules still let the job take each victim of another
    queue, asked as they were when it was taken (its pods back for the question). Sparing a
    victim of the taker's own queue raises what that queue holds, so a taking across queues
    that was fair with it may no longer be."""
    for victim, pods in victims:
        if victim.queue == job.queue:
            continue
        back = Statement(session)
        for pod in pods:
            back.restore(victim, pod)
        why = session.evict_refusal(job, victim, Res.total(pods))
        back.discard()
        if why:
            return False
    return True


def _units(chosen: list[Victim]) -> list[Victim]:
    """_units: the chosen victims as they may be spared: a job taken whole goes or stays whole
    (its surplus workers taken before with it), at the place where it was taken whole; each
    surplus worker of a job that keeps its minimum on its own."""
    whole = {v.id for v, pods in chosen if any(p.in_minimum for p in pods)}
    earlier: dict[str, list[RunningPod]] = {}
    units: list[Victim] = []
    for victim, pods in chosen:
        if victim.id not in whole:
            units.append((victim, pods))
        elif any(p.in_minimum for p in pods):
            units.append((victim, earlier.pop(victim.id, []) + pods))
        else:
            earlier.setdefault(victim.id, []).extend(pods)
    return units


def released(session: Session, victims: list[Victim]) -> Statement:
    """released: a statement releasing every pod of the victims."""
    releases = Statement(session)
    for victim, pods in victims:
        for pod in pods:
            releases.release(victim, pod)
    return releases


def stopping(session: Session, victim: JobInfo, pod: RunningPod) -> bool:
    return pod.terminating or (victim.id, pod.name) in session.evicted


def victim_class(victim: JobInfo) -> tuple[str, int, bool]:
    """victim_class: what the preemptable rules may look at (the victim's queue, priority and
    opt-out); jobs of one class are all allowed or all refused, so one answer serves all."""
    return (victim.queue, victim.priority, victim.preemptible)


def _useful(session: Session, job: JobInfo, minimum: list[PodRequest]) -> BoolArray:
    """_useful: the nodes some pod of the minimum may use."""
    useful = np.zeros(len(session.nodes), dtype=np.bool_)
    for wanted in minimum:
        useful |= session.static_mask(wanted, job)
    return useful


def spare_workers(session: Session, victim: JobInfo) -> int:
    """spare_workers: running workers beyond the job's minimum, not stopping. An in-minimum
    worker that is pending (its node was lost) counts as missing: the extras running stand in
    for it. Counted once per cycle; the evictions of the cycle take theirs off (mark_evicted)."""
    spare = session.spare_workers.get(victim.id)
    if spare is None:

        def live(pod: RunningPod) -> bool:
            return not stopping(session, victim, pod)

        running = sum(1 for p in victim.running if p.role == Role.WORKER and live(p))
        minimum = sum(1 for p in victim.running if p.role == Role.WORKER and p.in_minimum)
        minimum += sum(1 for p in victim.pending if p.role == Role.WORKER and p.in_minimum)
        session.spare_workers[victim.id] = spare = running - minimum
    return spare


def mark_evicted(session: Session, victim: JobInfo, pod: RunningPod) -> None:
    """mark_evicted records that the pod is to be evicted this cycle."""
    session.evicted.add((victim.id, pod.name))
    if pod.role == Role.WORKER and victim.id in session.spare_workers:
        session.spare_workers[victim.id] -= 1


def last_saved(victim: JobInfo) -> float:
    """last_saved: up to when the victim's work is safe: its last confirmed checkpoint, or
    when it last started if that is later or no checkpoint is known."""
    started = victim.start_time or 0.0
    if victim.checkpoint_time is None:
        return started
    return max(started, victim.checkpoint_time)


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
            key=lambda v: (len(v.running), v.priority, -last_saved(v), v.id),
        )
        session.victim_order = (surplus, whole)
    return session.victim_order
