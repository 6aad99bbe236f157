"""writes: the server's changes, written in the order they were made, as many at once as have
arrived (group commit), and the rows each change writes.

A change is queued the moment its records changed in memory; one writer task takes every change
queued meanwhile, merges them and writes them in one call (one store transaction), then settles
each change's future: a flood of submits and reports costs a transaction per batch, not per
change. A retention pruning, the rare change that says more than its records, goes alone.
Batches settle in the order they were queued, so the last change queued settles last.

This is the server's one write queue; the store's `write` is a plain call (one transaction,
one at a time). The queue is here rather than in the store because here the changes are whole:
merged as Effects, a batch is serialised once (`batch_for`), and what follows its write (orders
to agents, news to watchers, putting memory back after a refused write) is done once for the
batch; only here is a pruning known to need a transaction of its own.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable

from arranger.server.effects import Effects
from arranger.server.history import HistoryRecord
from arranger.server.model import EventRecord
from arranger.server.store import Batch, batch_of
from arranger.server.store.experiment_rows import experiment_row
from arranger.server.view import ClusterView

GROUP_WINDOW_S = 0.02  # a write this soon after the last one waits GROUP_DELAY_S for others
GROUP_DELAY_S = 0.003


class GroupCommit:
    """GroupCommit writes queued changes through `write`, a batch at a time (see the module).
    `queue` returns the future of a change (its write's error, if it failed); `written`
    returns once every change queued before the call is settled."""

    def __init__(self, write: Callable[[Effects], Awaitable[None]]) -> None:
        self._write = write
        self._queued: deque[tuple[Effects, asyncio.Future[None]]] = deque()
        self.last: asyncio.Future[None] | None = None  # settles after every earlier one
        self._writer: asyncio.Task[None] | None = None
        self._last_write = -math.inf  # when the last write ended (time.monotonic)

    def queue(self, fx: Effects) -> asyncio.Future[None]:
        """queue: `fx` is written after every change queued before it."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queued.append((fx, done))
        self.last = done
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_queued(), name="store-writer")
        return done

    async def written(self) -> None:
        """written returns once every change queued before the call is stored (or refused and
        rolled back): a read of the store that follows sees what memory showed at the call."""
        last = self.last
        if last is not None and not last.done():
            await asyncio.wait([last])  # its outcome is its committer's, not the reader's

    async def drained(self) -> None:
        """drained returns once the writer has written everything queued (the server stops)."""
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)

    async def _write_queued(self) -> None:
        while self._queued:
            if time.monotonic() - self._last_write < GROUP_WINDOW_S:
                # Writes come back to back: wait a little for more (PostgreSQL's commit_delay),
                # so that a flood costs fewer transactions, fewer syncs and fewer wake-ups.
                await asyncio.sleep(GROUP_DELAY_S)
            batch: list[asyncio.Future[None]] = []
            merged = Effects()
            try:
                while self._queued and not (batch and (merged.pruned or self._queued[0][0].pruned)):
                    fx, done = self._queued.popleft()
                    batch.append(done)
                    merged.merge(fx)
                await self._write(merged)
                self._last_write = time.monotonic()
            except Exception as exc:  # every change of the batch is refused alike
                for done in batch:
                    if not done.done():
                        done.set_exception(exc)
                        done.exception()  # retrieved: a caller that gave up is not an error
            except BaseException:  # cancelled: no change waits for a writer that is gone
                for done in [*batch, *(queued for _, queued in self._queued)]:
                    done.cancel()
                self._queued.clear()
                raise
            else:
                for done in batch:
                    if not done.done():
                        done.set_result(None)


def batch_for(
    view: ClusterView,
    fx: Effects,
    history: list[HistoryRecord],
    events: list[EventRecord] | None = None,
) -> Batch:
    """batch_for: the store's rows for what `fx` touched, as the records are now, with
    `events` in place of its events when given (those limits.EventBudget lets be stored)."""
    jobs = [job for job in map(view.job, fx.jobs) if job is not None]
    pods = [found[1] for found in map(view.pod, fx.pods) if found is not None]
    nodes = [node for node in map(view.node, fx.nodes) if node is not None]
    queues = [queue for queue in map(view.queue, fx.queues) if queue is not None]
    events = fx.events if events is None else events
    batch = batch_of(jobs, pods, nodes, events, fx.removed, queues, fx.removed_queues, history)
    batch.pruned = fx.pruned
    batch.experiments = [experiment_row(exp) for exp in fx.experiments]
    batch.left_experiments = sorted({j.experiment for j in fx.removed.values() if j.experiment})
    for job_id, change in fx.reports.items():
        batch.report_points += [(job_id, *point) for point in change.points]
        batch.report_gone += [(job_id, *gone) for gone in change.gone]
        batch.report_notes += [(job_id, *note) for note in change.notes]
    return batch
