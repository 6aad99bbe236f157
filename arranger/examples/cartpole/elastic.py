"""elastic: the learner's side of Arranger: more actors while learning is slow, and news of
evictions.

`ScaleRule` is the rule, a pure object. `ArrangerLink` is the learner's line to the job it runs
in (through the in-job SDK, arranger.job): how many actors the job wants and may have, asking
for more, and the job's events (an eviction notice above all). A learner started by hand has
no link (`ArrangerLink.connect` returns None): it trains with the actors that come, and
checkpoints only when stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import grpc

from arranger.job import Event, Job, NotInJob, current


@dataclass
class ScaleRule:
    """ScaleRule: ask for one more actor while the average return grows slowly.

    Once `every_updates` updates have been applied since its mark, the rule looks: when the
    average return rose by less than `min_gain` since the mark, every actor wanted is
    connected (so one more would be put to work, not wait for room) and fewer than the set's
    maxCounts are wanted, it wants one more. Every look moves the mark to (version, average),
    so each new actor has `every_updates` updates to show its worth before the next look.
    The mark starts at (0, 0): the first look compares with the return before any episode."""

    every_updates: int = 20
    min_gain: float = 10.0
    mark_version: int = 0
    mark_average: float = 0.0

    def look(self, version: int, average: float, wanted: int, connected: int, most: int) -> int:
        """look returns the number of actors to want now (`wanted`: no change)."""
        if version - self.mark_version < self.every_updates:
            return wanted
        gain = average - self.mark_average
        self.mark_version, self.mark_average = version, average
        if gain < self.min_gain and connected >= wanted and wanted < most:
            return wanted + 1
        return wanted


class ArrangerLink:
    """ArrangerLink: the running job, as the learner sees it. `wanted` is how many actors of
    `actor_set` the job wants now, `most` its maxCounts; `events` gathers the job's events in
    the background. Calls that fail are logged and reported as False, never raised: the
    learner trains on without Arranger's answer."""

    def __init__(self, job: Job, actor_set: str, log: Callable[[str], None]) -> None:
        self.job = job
        self.actor_set = actor_set
        self._log = log
        spec = job.get().spec
        found = [ws for ws in spec.worker_sets if ws.name == actor_set]
        if not found:
            names = ", ".join(ws.name for ws in spec.worker_sets) or "none"
            raise LookupError(f"the job has no worker set {actor_set!r} (it has: {names})")
        self.wanted = found[0].counts
        self.most = max(found[0].max_counts, found[0].counts)
        self.events = job.subscribe()
        self.reported = -1  # the version last reported
        job.heartbeat()  # ready: the sets that start after it (startAfter: leaderReady) may

    @classmethod
    def connect(cls, actor_set: str, log: Callable[[str], None]) -> ArrangerLink | None:
        """connect: the link to the job this program runs in; None when it runs by hand (or
        Arranger cannot be reached: that is logged)."""
        try:
            job = current()
        except NotInJob:
            return None
        try:
            return cls(job, actor_set, log)
        except (grpc.RpcError, LookupError) as exc:
            log(f"learner: not elastic: {_why(exc)}")
            job.close()
            return None

    def poll(self) -> list[Event]:
        """poll: the job's events since the last call (never blocks)."""
        return self.events.poll()

    def scale(self, counts: int) -> bool:
        """scale asks for `counts` actors; True when the job took it."""
        try:
            reply = self.job.scale(self.actor_set, counts)
        except grpc.RpcError as exc:
            self._log(f"learner: could not scale {self.actor_set} to {counts}: {_why(exc)}")
            return False
        sets = [ws for ws in reply.spec.worker_sets if ws.name == self.actor_set]
        self.wanted = sets[0].counts if sets else counts
        return True

    def progress(self, version: int, average: float) -> None:
        """progress reports the learner's version and average return once per version (its
        progress for progressTimeoutSeconds; buffered by the SDK, sent about once a second),
        and says it is alive while no new version comes (a heartbeat: a learner whose actors
        are away waits, it is not hung)."""
        if version != self.reported:
            self.job.report(version, avg_return=average)
            self.reported = version
        else:
            self.job.heartbeat()

    def checkpointed(self) -> bool:
        """checkpointed tells Arranger the checkpoint is saved, so the eviction may go ahead
        now; True when it took the answer."""
        try:
            self.job.checkpointed()
        except grpc.RpcError as exc:
            self._log(f"learner: could not confirm the checkpoint: {_why(exc)}")
            return False
        return True

    def close(self) -> None:
        self.job.close()


def _why(exc: BaseException) -> str:
    """_why: an error in one line (a gRPC error by its code and details)."""
    if isinstance(exc, grpc.RpcError) and isinstance(exc, grpc.Call):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc)
