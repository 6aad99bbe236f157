"""watch fans job changes out to WatchJobs streams."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from arranger.v1 import arranger_pb2, job_pb2

MAX_BACKLOG = 1_000


@dataclass(eq=False)
class Subscription:
    """Subscription is one watcher: a job filter (name or id, empty: all) and its queue.

    A watcher that falls MAX_BACKLOG changes behind is dropped (`overflowed`), never the server.
    """

    job: str
    queue: asyncio.Queue[arranger_pb2.WatchJobsResponse | None] = field(
        default_factory=asyncio.Queue
    )
    overflowed: bool = False

    def wants(self, msg: job_pb2.TYJob) -> bool:
        return not self.job or self.job in (msg.metadata.name, msg.metadata.id)


class WatchHub:
    def __init__(self) -> None:
        self.subscriptions: set[Subscription] = set()

    def subscribe(self, job: str) -> Subscription:
        sub = Subscription(job)
        self.subscriptions.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self.subscriptions.discard(sub)

    def publish(self, kind: str, msg: job_pb2.TYJob) -> None:
        for sub in list(self.subscriptions):
            if not sub.wants(msg):
                continue
            if sub.queue.qsize() >= MAX_BACKLOG:
                sub.overflowed = True
                self.subscriptions.discard(sub)
                sub.queue.put_nowait(None)
                continue
            sub.queue.put_nowait(arranger_pb2.WatchJobsResponse(type=kind, job=msg))
