"""placement puts pods on nodes: filter, score, take the best, check GPUs exactly.

Pods of one group (a worker set's identical pods) share one vectorised pass: the static mask,
the resource fit and the scores are computed once over all nodes; after each placement only
the chosen node is scored again. Placing k pods on N nodes costs one O(N) pass plus k argmax
calls, not k full passes (GroupPlacer), also when groups of several jobs take turns.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from arranger.sched import reasons
from arranger.sched.nodes import BoolArray, FloatArray, Index, IntArray, NodeArrays
from arranger.sched.session import Session
from arranger.sched.snapshot import GPU_MILLI, JobInfo, PodRequest
from arranger.sched.statement import Statement
from arranger.states import Role


def groups(pods: list[PodRequest]) -> Iterator[list[PodRequest]]:
    """groups splits pods into runs of identical shape (leader, then each worker set), in order."""
    run: list[PodRequest] = []
    for pod in pods:
        if run and pod.shape != run[0].shape:
            yield run
            run = []
        run.append(pod)
    if run:
        yield run


def ordered(pods: list[PodRequest]) -> list[PodRequest]:
    """ordered: the leader first, then workers by rank (so by set, then index)."""
    return sorted(pods, key=lambda p: (p.role != Role.LEADER, p.rank))


def place_group(
    session: Session,
    statement: Statement,
    job: JobInfo,
    pods: list[PodRequest],
    only: BoolArray | None = None,
) -> int:
    """place_group places the group's pods one by one on the best nodes (among `only`, when
    given); returns how many it placed (stopping at the first that fits nowhere)."""
    if not pods:
        return 0
    return GroupPlacer(session, statement, job, pods[0], only).place(pods)


# Beyond this many placements by others since its last, a placer scores every node again (one
# vectorised pass) rather than those nodes one by one.
CATCH_UP = 32


class GroupPlacer:
    """GroupPlacer places pods of one shape (a group) on the best nodes. The mask and the
    scores over all nodes are computed once; after each placement only the chosen node is
    scored again. Placements of others in between (another job's turn in backfill) are named
    in `changed`, a log of node indexes shared by the placers of a pass: a placer scores the
    nodes logged since its last placement again before it places more.
    """

    def __init__(
        self,
        session: Session,
        statement: Statement,
        job: JobInfo,
        first: PodRequest,
        only: BoolArray | None = None,
        changed: list[int] | None = None,
    ) -> None:
        self.session, self.statement, self.job, self.first = session, statement, job, first
        self.nodes = nodes = statement.nodes
        static = session.static_mask(first, job, nodes)
        self.static = static if only is None else static & only
        mask = self.static & nodes.fits(first, slice(None))
        self.scores: FloatArray | None = None
        if mask.any():
            self.scores = self._all(mask)
        self.changed = changed
        self.seen = len(changed) if changed is not None else 0

    def _all(self, mask: BoolArray) -> FloatArray:
        every = _scores(self.session, self.nodes, self.first, self.job, slice(None))
        scores: FloatArray = np.where(mask, every, -np.inf)
        return scores

    def place(self, pods: list[PodRequest]) -> int:
        """place puts the pods, one by one, on the best nodes; returns how many it placed
        (stopping at the first that fits nowhere)."""
        scores = self.scores
        if scores is None:
            return 0
        changed = self.changed
        if changed is not None and len(changed) > self.seen:
            if len(changed) - self.seen > CATCH_UP:  # cheaper to score every node again
                self.scores = scores = self._all(
                    self.static & self.nodes.fits(self.first, slice(None))
                )
            else:
                for node in set(changed[self.seen :]):
                    self._rescore(node)
        session, nodes, job, statement = self.session, self.nodes, self.job, self.statement
        placed = 0
        for pod in pods:
            while True:
                node = int(np.argmax(scores))
                if scores[node] == -np.inf:
                    return placed
                gpus = session.choose_gpus(nodes, node, pod, job)
                if gpus is not None:
                    break
                scores[node] = -np.inf  # mixed GPU models: the exact check said no
            statement.allocate(job, pod, node, gpus)
            placed += 1
            self._rescore(node)
            if changed is not None:
                changed.append(node)
                self.seen = len(changed)
        return placed

    def _rescore(self, node: int) -> None:
        """Only this node changed: score it again alone (numpy scalars, no arrays)."""
        assert self.scores is not None
        if self.static[node] and self.nodes.fits_one(self.first, node):
            self.scores[node] = _scores(self.session, self.nodes, self.first, self.job, node)
        else:
            self.scores[node] = -np.inf


def _scores(
    session: Session, nodes: NodeArrays, pod: PodRequest, job: JobInfo, at: Index
) -> FloatArray:
    if nodes is session.nodes:
        return session.score(pod, job, at)
    # A what-if on other arrays: any order will do, the question is only whether it fits.
    used: FloatArray = nodes.used_cpu[at] / nodes.div_cpu[at]
    return used


@dataclass(frozen=True)
class Misfit:
    """Misfit: the `position`-th pod of the ordered gang found no node; `counts` says why,
    per filter, over `total_nodes`. It names no pod, so jobs of the same shape can share it."""

    position: int
    total_nodes: int
    counts: tuple[tuple[str, int], ...]

    def message(self, pods: list[PodRequest], minimum: bool = True) -> str:
        pod = ordered(pods)[self.position]
        return reasons.render(pod.name, self.total_nodes, dict(self.counts), pod.gpu_type, minimum)


def place_all_or_nothing(
    session: Session,
    job: JobInfo,
    pods: list[PodRequest],
    nodes: NodeArrays | None = None,
    only: BoolArray | None = None,
    explained: bool = True,
) -> tuple[Statement, Misfit | None]:
    """place_all_or_nothing places every pod or none. On success it returns the statement
    (not yet committed) and None; on failure the statement is discarded and the Misfit says
    which pod fit nowhere and why (without counts, when not `explained`: a cheaper no).

    A leader (any single pod first) followed by one set of identical workers is placed
    again when the workers do not fit beside the leader's best node: the leader then goes
    to the best node that leaves room for them all (first_places). For CPU, memory and whole
    GPUs that second try is exact: the gang is placed whenever some placement exists. A gang
    whose pods that want GPUs come after others is placed again with those first, so that
    pods without GPUs, placed first on the best nodes, do not take the room a GPU pod needed
    beside its GPU (more room free must never make a gang fit less)."""
    pods = ordered(pods)
    statement, misfit = _place(session, job, pods, nodes, only, None, explained)
    if misfit is None:
        return statement, None
    shapes = list(groups(pods))
    scarce = [p for group in shapes if group[0].gpu_milli > 0 for p in group]
    rest = [p for group in shapes if group[0].gpu_milli == 0 for p in group]
    if scarce and rest and [*scarce, *rest] != pods:
        again, second = _place(session, job, [*scarce, *rest], nodes, only, None, False)
        if second is None:
            return again, None
    if len(shapes) != 2 or len(shapes[0]) != 1 or misfit.position == 0:
        return statement, misfit
    first, rest = shapes[0][0], shapes[1]
    places = np.zeros(len(statement.nodes), dtype=np.bool_)
    places[first_places(session, statement.nodes, job, first, rest[0], len(rest), only)] = True
    if not places.any():
        return statement, misfit
    again, second = _place(session, job, [first, *rest], nodes, only, places, False)
    return (again, None) if second is None else (statement, misfit)


def _place(
    session: Session,
    job: JobInfo,
    pods: list[PodRequest],
    nodes: NodeArrays | None,
    only: BoolArray | None,
    first_only: BoolArray | None,
    explained: bool,
) -> tuple[Statement, Misfit | None]:
    """_place: place_all_or_nothing's one try over the ordered pods, the first group kept to
    `first_only` when given."""
    statement = Statement(session, nodes)
    position = 0
    for number, group in enumerate(groups(pods)):
        within = only
        if number == 0 and first_only is not None:
            within = first_only if only is None else first_only & only
        placed = place_group(session, statement, job, group, within)
        if placed < len(group):
            counts = (
                misfit_counts(session, statement.nodes, group[placed], job) if explained else {}
            )
            statement.discard()
            return statement, Misfit(position + placed, len(statement.nodes), tuple(counts.items()))
        position += len(group)
    return statement, None


def first_places(
    session: Session,
    nodes: NodeArrays,
    job: JobInfo,
    first: PodRequest,
    rest: PodRequest,
    count: int,
    only: BoolArray | None = None,
    rest_room: IntArray | None = None,
) -> IntArray:
    """first_places: the nodes where `first` fits and after which the nodes still take
    `count` pods like `rest` (each node counted on its own, that one with `first` on it).
    `rest_room`: each node's room_for(rest, count), 0 where rest may not go, when known."""
    first_mask = session.static_mask(first, job, nodes) & nodes.fits(first, slice(None))
    rest_mask = session.static_mask(rest, job, nodes)
    if only is not None:
        first_mask, rest_mask = first_mask & only, rest_mask & only
    if rest_room is None:
        rest_room = np.where(rest_mask, nodes.room_for(rest, count, slice(None)), 0)
    places = np.flatnonzero(first_mask)
    beside = np.where(rest_mask[places], nodes.room_for(rest, count, places, taken=first), 0)
    enough: IntArray = places[int(rest_room.sum()) - rest_room[places] + beside >= count]
    return enough


def misfit_counts(
    session: Session, nodes: NodeArrays, pod: PodRequest, job: JobInfo
) -> dict[str, int]:
    """misfit_counts counts, for each filter in order, the nodes it is the first to reject."""
    remaining = np.ones(len(nodes), dtype=np.bool_)
    counts: dict[str, int] = {}
    checks = session.filter_checks(pod, job, nodes)
    checks += [
        (reasons.INSUFFICIENT_CPU, nodes.cpu_fits(pod, slice(None))),
        (reasons.INSUFFICIENT_MEMORY, nodes.memory_fits(pod, slice(None))),
    ]
    if pod.gpu_milli:
        checks.append((reasons.GPU_UNHEALTHY, ~_unhealthy_in_the_way(nodes, pod)))
        checks.append((reasons.INSUFFICIENT_GPU, nodes.gpu_fits(pod, slice(None))))
    for reason, passes in checks:
        rejected = remaining & ~passes
        counts[reason] = counts.get(reason, 0) + int(rejected.sum())
        remaining &= passes
    return counts


def _unhealthy_in_the_way(nodes: NodeArrays, pod: PodRequest) -> BoolArray:
    """_unhealthy_in_the_way: the nodes whose GPUs do not take the pod's, but would if their
    unhealthy GPUs were healthy and free."""
    sick = nodes.gpu_unhealthy
    if pod.gpu_milli >= GPU_MILLI:
        wanted = pod.gpu_milli // GPU_MILLI
        whole: BoolArray = (nodes.free_whole < wanted) & (nodes.free_whole + sick >= wanted)
        return whole
    share: BoolArray = (nodes.best_share < pod.gpu_milli) & (sick > 0)
    return share


def explain(
    session: Session, nodes: NodeArrays, pod: PodRequest, job: JobInfo, minimum: bool
) -> str:
    """explain says why no node takes the pod, counting nodes per filter."""
    counts = misfit_counts(session, nodes, pod, job)
    return reasons.render(pod.name, len(nodes), counts, pod.gpu_type, minimum)
