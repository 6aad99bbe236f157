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
taking across queues still passes the evictable rules; what is left is a set from which no
victim can be spared.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import numpy as np

from arranger.sched.nodes import BoolArray, IntArray
from arranger.sched.placement import groups, ordered, place_all_or_nothing
from arranger.sched.resources import Res, ratio
from arranger.sched.session import Session
from arranger.sched.snapshot import GPU_MILLI, JobInfo, PodRequest, RunningPod
from arranger.sched.statement import Statement
from arranger.states import Role

Victim = tuple[JobInfo, list[RunningPod]]


def candidates(
    session: Session, job: JobInfo, minimum: list[PodRequest], reclaim: bool,
    protected: set[str],
) -> Iterator[Victim]:  # fmt: skip
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

    while session.victim_cursor < len(surplus) and stopping(
        session, *surplus[session.victim_cursor]
    ):
        session.victim_cursor += 1  # taken by earlier preemptors: skip them for good
    first: Iterable[tuple[JobInfo, RunningPod]] = itertools.islice(
        surplus, session.victim_cursor, None
    )
    if reclaim:
        first, whole = _most_over_first(session, job, minimum, list(first), whole)
    spare: dict[str, int] = {}  # workers each victim can lose and keep its minimum running
    for victim, one in first:
        if not (may(victim) and live(victim, one) and useful[index[one.node]]):
            continue
        if young(victim, one.start_time):
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
    session: Session, job: JobInfo, minimum: list[PodRequest],
    surplus: list[tuple[JobInfo, RunningPod]], whole: list[JobInfo],
) -> tuple[list[tuple[JobInfo, RunningPod]], list[JobInfo]]:  # fmt: skip
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
    session: Session, job: JobInfo, minimum: list[PodRequest], chosen: list[Victim],
    releases: Statement, claim: Statement,
) -> tuple[list[Victim], Statement, Statement]:  # fmt: skip
    """minimal spares every victim the claim does not need (see the module's docstring). It
    takes the chosen victims with `releases` (their pods released) and `claim` (the minimum
    placed) applied, and returns the victims kept with fresh statements for them, applied."""
    units = _units(chosen)
    if len(units) == 1:
        return chosen, releases, claim
    # First, in one go, the victims with no pod on a node the claim uses (most of them, when
    # the victims were taken across the cluster): the claim stands without them unless the
    # queue's capability needed them.
    used = claim.nodes_used()
    index = session.nodes.index
    near = [u for u in units if any(index[p.node] in used for p in u[1])]
    if len(near) < len(units):
        claim.discard()
        releases.discard()
        releases = released(session, near)
        fair = _still_allowed(session, job, near)
        again = claim_room(session, job, minimum) if fair else None
        if again is None:  # the capability or the shares needed them: all of them again
            releases.discard()
            releases = released(session, units)
            again = claim_room(session, job, minimum)
            assert again is not None, "the same cluster took the minimum a moment ago"
        else:
            units = near
        claim = again
    if len(units) == 1:
        return units, releases, claim
    # Then one at a time, the costliest first; the last taken was needed (without it the
    # minimum did not fit).
    claim.discard()
    room = Room(session, job, minimum)
    kept = list(units)
    spared: list[Statement] = []
    last = chosen[-1][1][-1]  # a pod of the victim taken last
    for unit in [u for u in reversed(units) if last not in u[1]]:
        victim, pods = unit
        back = Statement(session)
        for pod in pods:
            room.before(index[pod.node])
            back.restore(victim, pod)
            room.changed(index[pod.node])
        attempt = claim_room(session, job, minimum, checked=True) if room.worth_placing() else None
        if attempt is not None:
            attempt.discard()
            others = [u for u in kept if u is not unit]
            if _still_allowed(session, job, others):
                spared.append(back)
                kept.remove(unit)
                continue
        for node in {index[pod.node] for pod in pods}:
            room.before(node)
        back.discard()
        for node in {index[pod.node] for pod in pods}:
            room.changed(node)
    for back in reversed(spared):
        back.discard()
    releases.discard()
    releases = released(session, kept)
    again = claim_room(session, job, minimum)
    assert again is not None, "the same cluster took the minimum a moment ago"
    return kept, releases, again


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


def _spare_workers(session: Session, victim: JobInfo) -> int:
    """_spare_workers: running workers beyond the job's minimum. An in-minimum worker that is
    pending (its node was lost) counts as missing: the extras running stand in for it."""

    def live(pod: RunningPod) -> bool:
        return not stopping(session, victim, pod)

    running = sum(1 for p in victim.running if p.role == Role.WORKER and live(p))
    minimum = sum(1 for p in victim.running if p.role == Role.WORKER and p.in_minimum)
    minimum += sum(1 for p in victim.pending if p.role == Role.WORKER and p.in_minimum)
    return running - minimum


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


def claim_room(
    session: Session, job: JobInfo, minimum: list[PodRequest], checked: bool = False
) -> Statement | None:
    """claim_room places the minimum tentatively and returns the statement holding it, or
    None when it does not fit (or its queue may not take it). `checked`: the caller already
    knows each shape has room on its own."""
    if session.admit(job, Res.total(minimum)):
        return None
    if not checked and not Room(session, job, minimum).enough():
        return None
    statement, misfit = place_all_or_nothing(session, job, minimum, explained=False)
    return statement if misfit is None else None


class Room:
    """Room answers quickly whether a placement is worth trying, by necessary conditions:
    for each pod shape of the minimum, the usable nodes have room for that many pods of it,
    each node counted on its own; the nodes some pod may use have, all together, the CPU and
    the whole GPUs the minimum asks for; and (worth_placing) a leader and its workers fit
    together, each node counted with the leader on it or not. After a
    release or a restore, `changed(node)` updates one node in O(shapes)."""

    def __init__(self, session: Session, job: JobInfo, minimum: list[PodRequest]) -> None:
        self.nodes = session.nodes
        self.shapes = [(group[0], len(group)) for group in groups(ordered(minimum))]
        self.masks = [session.static_mask(pod, job) for pod, _ in self.shapes]
        self.room = [self._room(pod, count, slice(None)) for pod, count in self.shapes]
        self.totals = [int(r[m].sum()) for r, m in zip(self.room, self.masks, strict=True)]
        nodes = self.nodes
        self.usable = np.logical_or.reduce(self.masks)
        self.cpu_wanted = sum(p.cpu_milli * n for p, n in self.shapes)
        self.gpus_wanted = sum(
            (p.gpu_milli // GPU_MILLI) * n for p, n in self.shapes if p.gpu_milli >= GPU_MILLI
        )
        free_cpu = np.maximum(0, nodes.alloc_cpu - nodes.used_cpu)
        self.cpu = int(free_cpu[self.usable].sum())
        self.gpus = int(nodes.free_whole[self.usable].sum())

    def _free(self, node: int) -> tuple[int, int]:
        nodes = self.nodes
        return max(0, int(nodes.alloc_cpu[node] - nodes.used_cpu[node])), int(
            nodes.free_whole[node]
        )

    def before(self, node: int) -> None:
        """before: the node is about to change (a release or a restore); `changed` after."""
        if self.usable[node]:
            cpu, gpus = self._free(node)
            self.cpu -= cpu
            self.gpus -= gpus

    def _room(
        self, pod: PodRequest, count: int, at: slice | int | IntArray,
        taken: PodRequest | None = None,
    ) -> IntArray:  # fmt: skip
        """_room: how many pods like `pod` (at most `count`) each node at `at` takes, with
        `taken` placed there first when given (its share of a GPU taking no whole GPU: this
        must never count fewer than would fit)."""
        nodes = self.nodes
        cpu, mem, gpu, whole = 0, 0, 0, 0
        if taken is not None:
            cpu, mem, gpu = taken.cpu_milli, taken.memory_bytes, taken.gpu_milli
            whole = gpu // GPU_MILLI
        free_cpu = nodes.alloc_cpu[at] - nodes.used_cpu[at] - cpu
        room = np.minimum(count, np.maximum(0, free_cpu // max(pod.cpu_milli, 1)))
        if pod.memory_bytes:
            free_mem = nodes.alloc_mem[at] - nodes.used_mem[at] - mem
            room = np.minimum(room, np.maximum(0, free_mem // pod.memory_bytes))
        if pod.gpu_milli >= GPU_MILLI:
            free_whole = nodes.free_whole[at] - whole
            room = np.minimum(room, np.maximum(0, free_whole // (pod.gpu_milli // GPU_MILLI)))
        elif pod.gpu_milli:
            free_gpu = nodes.alloc_gpu[at] - nodes.used_gpu[at] - gpu
            room = np.minimum(room, np.maximum(0, free_gpu // pod.gpu_milli))
        result: IntArray = np.asarray(room, dtype=np.int64)
        return result

    def _leader_and_workers(self) -> bool:
        """_leader_and_workers: for a minimum of one leader and one set of workers, whether
        some node can take the leader with enough room left for the workers, counting on each
        node the workers that fit beside it (the shapes compete for the same nodes)."""
        (leader, _), (worker, count) = self.shapes
        places = np.nonzero(self.masks[0] & (self.room[0] > 0))[0]
        if len(places) == 0:
            return False
        workers = np.where(self.masks[1], self.room[1], 0)
        beside = self._room(worker, count, places, taken=leader)
        beside = np.where(self.masks[1][places], beside, 0)
        return int(workers.sum()) + int((beside - workers[places]).max()) >= count

    def changed(self, node: int) -> None:
        if self.usable[node]:
            cpu, gpus = self._free(node)
            self.cpu += cpu
            self.gpus += gpus
        for i, (pod, count) in enumerate(self.shapes):
            if self.masks[i][node]:
                new = int(self._room(pod, count, node))
                self.totals[i] += new - int(self.room[i][node])
                self.room[i][node] = new

    def enough(self) -> bool:
        return (
            self.cpu >= self.cpu_wanted
            and self.gpus >= self.gpus_wanted
            and all(
                total >= count for total, (_, count) in zip(self.totals, self.shapes, strict=True)
            )
        )

    def worth_placing(self) -> bool:
        """worth_placing: enough(), and, for a leader with one set of workers, room for both
        together (dearer: asked only before a trial placement)."""
        if not self.enough():
            return False
        if len(self.shapes) == 2 and self.shapes[0][1] == 1:
            return self._leader_and_workers()
        return True
