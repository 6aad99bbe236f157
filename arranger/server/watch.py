"""watch fans job changes out to WatchJobs streams and keeps the recent ones for resuming.

Every committed change of a job becomes one message, built once and shared by every watcher
and by the ring of recent changes. Changes are numbered from 1 in commit order; a resume
token names a change ("epoch/seq": resume after change `seq`) or, during a watch's initial
listing, a place in it too ("epoch/seq/<job key>": the listing as of change `seq`, continued
after that job). The epoch is new each time the server starts, so a token from an earlier
run is known to be stale rather than misread.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import islice

from arranger.server.convert import job_progress, job_summary, pod_status
from arranger.server.effects import Effects
from arranger.server.listing import Key, key_token, parse_key
from arranger.server.model import PodRecord
from arranger.server.retention import PRUNED
from arranger.server.view import ClusterView
from arranger.v1 import arranger_pb2

MAX_BACKLOG = 1_000  # changes one watcher may have waiting before it is dropped
RING_CHANGES = 10_000  # changes kept for resuming
RING_BYTES = 64 * 2**20  # and at most this much of them

ADDED, MODIFIED, DELETED, SYNCED = "ADDED", "MODIFIED", "DELETED", "SYNCED"


@dataclass(frozen=True)
class Change:
    """Change: one job's change as numbered `seq`, with the message every watcher gets."""

    seq: int
    job_id: str
    name: str
    msg: arranger_pb2.WatchJobsResponse
    size: int  # the message's bytes on the wire
    noticed: bool = False  # a pod in it is under an eviction notice (sent with the clock)


@dataclass(frozen=True)
class Position:
    """Position: where a resume token points: after change `seq`, and, when `listing` is
    set, in the middle of an initial listing (as of `seq`), after the job with that key."""

    seq: int
    listing: Key | None = None


@dataclass(eq=False)
class Subscription:
    """Subscription is one watcher: a job filter (name or id, empty: all; an id only when
    `by_id`, so that no job named like it slips in) and its queue.

    A watcher that falls MAX_BACKLOG changes behind is dropped (`overflowed`), never the server.
    """

    job: str
    by_id: bool = False
    queue: asyncio.Queue[Change | None] = field(default_factory=asyncio.Queue)
    overflowed: bool = False

    def wants(self, change: Change) -> bool:
        if self.by_id:
            return change.job_id == self.job
        return not self.job or self.job in (change.name, change.job_id)


class WatchHub:
    """WatchHub numbers changes, hands them to subscriptions and keeps the last `ring_changes`
    (at most `ring_bytes` of them) so that a watcher can resume after any of them."""

    def __init__(self, ring_changes: int = RING_CHANGES, ring_bytes: int = RING_BYTES) -> None:
        self.subscriptions: set[Subscription] = set()
        self.epoch = secrets.token_hex(4)
        self.seq = 0  # the last change's number
        self._ring: deque[Change] = deque()
        self._ring_bytes = 0
        self._ring_changes, self._ring_limit = ring_changes, ring_bytes
        self._forgotten = 0  # the newest change no longer kept: tokens before it are stale

    def subscribe(self, job: str, by_id: bool = False) -> Subscription:
        sub = Subscription(job, by_id)
        self.subscriptions.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self.subscriptions.discard(sub)

    # Tokens.

    def token(self, seq: int, listing: Key | None = None) -> str:
        base = f"{self.epoch}/{seq}"
        return base if listing is None else f"{base}/{key_token(listing)}"

    def position(self, token: str) -> Position | None:
        """position: where the token points, None if it is not this server run's, is not a
        token, or names a change no longer kept (the changes after it cannot all be sent)."""
        parts = token.split("/", 2)
        if len(parts) < 2 or parts[0] != self.epoch or not parts[1].isdigit():
            return None
        seq = int(parts[1])
        listing = parse_key(parts[2]) if len(parts) == 3 else None
        if len(parts) == 3 and listing is None:
            return None
        if not self._forgotten <= seq <= self.seq:
            return None
        return Position(seq, listing)

    def since(self, seq: int) -> list[Change]:
        """since: the changes after `seq`, which must be a position's (all of them are kept)."""
        if not self._ring or seq >= self.seq:
            return []
        return list(islice(self._ring, seq - self._ring[0].seq + 1, None))

    # Publishing.

    def publish(self, news: Iterable[tuple[str, str, arranger_pb2.WatchJobsResponse]]) -> None:
        """publish numbers each (job id, name, message), stamps its resume token, keeps it in
        the ring and queues it for every watcher of that job; a watcher MAX_BACKLOG behind
        before this news is dropped (one change's news, an experiment's members, is queued
        whole: it is bounded by the change)."""
        behind = {sub for sub in self.subscriptions if sub.queue.qsize() >= MAX_BACKLOG}
        for job_id, name, msg in news:
            self.seq += 1
            msg.resume_token = self.token(self.seq)
            noticed = any(pod.HasField("evict_at") for pod in msg.pods)
            change = Change(self.seq, job_id, name, msg, msg.ByteSize(), noticed)
            self._keep(change)
            for sub in list(self.subscriptions):
                if not sub.wants(change):
                    continue
                if sub in behind:
                    sub.overflowed = True
                    self.subscriptions.discard(sub)
                    sub.queue.put_nowait(None)
                    continue
                sub.queue.put_nowait(change)

    def _keep(self, change: Change) -> None:
        self._ring.append(change)
        self._ring_bytes += change.size
        while len(self._ring) > self._ring_changes or self._ring_bytes > self._ring_limit:
            old = self._ring.popleft()
            self._ring_bytes -= old.size
            self._forgotten = old.seq

    def close(self) -> None:
        """close ends every watcher's stream (the server is stopping)."""
        for sub in list(self.subscriptions):
            sub.queue.put_nowait(None)


def news_of(
    view: ClusterView, fx: Effects
) -> list[tuple[str, str, arranger_pb2.WatchJobsResponse]]:
    """news_of: what watchers are told of these effects, one message per job, built now
    (before the records change again) and once for all of them. A job submitted here is
    ADDED with its summary; a job deleted here is DELETED, and nothing more is said of it
    while its processes stop; any other job touched is MODIFIED: its progress and the pods
    that changed."""
    pods: dict[str, list[PodRecord]] = defaultdict(list)
    for uid in fx.pods:
        found = view.pod(uid)
        if found is not None:
            pods[found[0].id].append(found[1])
    ids = set(fx.jobs) | set(pods) | set(fx.removed)
    submitted = {e.job_id for e in fx.events if e.kind == "Submitted"}
    deleted = {e.job_id for e in fx.events if e.kind in ("Deleted", PRUNED)}
    news = []
    for job_id in sorted(ids):
        job = view.job(job_id) or fx.removed.get(job_id)
        if job is None:
            continue
        msg = arranger_pb2.WatchJobsResponse(name=job.name, id=job.id)
        if job_id in deleted:
            msg.type = DELETED
        elif job.deleted:
            continue
        elif job_id in submitted:
            msg.type = ADDED
            msg.summary.CopyFrom(job_summary(job))
        else:
            msg.type = MODIFIED
            job_progress(job, msg.progress)
            changed = sorted(pods.get(job_id, ()), key=lambda pod: pod.rank)
            msg.pods.extend(pod_status(pod, view.address) for pod in changed)
        news.append((job.id, job.name, msg))
    return news
