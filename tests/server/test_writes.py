"""GroupCommit, the server's one write queue (server.writes): changes queued while a write is
under way go together in the next one, in order; a pruning goes alone; a refused write refuses
every change of its batch. The writes are a stand-in held at a gate the test opens."""

from __future__ import annotations

import asyncio

import pytest

from arranger.server.effects import Effects, Pruning
from arranger.server.model import EventRecord
from arranger.server.store import StoreError
from arranger.server.writes import GroupCommit
from tests.conftest import eventually


def change(n: int, pruned: bool = False) -> Effects:
    """change: effects with one event, "n"; a pruning too when `pruned`."""
    fx = Effects(pruned=Pruning(events_before=1.0) if pruned else None)
    fx.events.append(EventRecord(float(n), "Test", str(n)))
    return fx


class Writes:
    """Writes stands in for the store's write: it notes each batch's events, and holds each
    write at a gate while it is closed; batches whose events are in `refused` fail."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.waiting = 0
        self.refused: set[str] = set()

    async def write(self, fx: Effects) -> None:
        said = [event.message for event in fx.events]
        self.waiting += 1
        await self.gate.wait()
        self.waiting -= 1
        self.batches.append(said)
        if self.refused.intersection(said):
            raise StoreError("refused")


async def held_first(writes: Writes, commits: GroupCommit) -> asyncio.Future[None]:
    """held_first: change 0, its write held at the gate."""
    writes.gate.clear()
    first = commits.queue(change(0))
    await eventually(lambda: writes.waiting == 1, what="the first write at the gate")
    return first


async def test_a_flood_of_changes_costs_a_write_per_batch() -> None:
    writes = Writes()
    commits = GroupCommit(writes.write)
    first = await held_first(writes, commits)
    flood = [commits.queue(change(n)) for n in range(1, 101)]
    writes.gate.set()
    await asyncio.gather(first, *flood)
    assert writes.batches == [["0"], [str(n) for n in range(1, 101)]]


async def test_batches_settle_in_the_order_they_were_queued() -> None:
    writes = Writes()
    commits = GroupCommit(writes.write)
    settled: list[int] = []
    first = await held_first(writes, commits)
    first.add_done_callback(lambda _: settled.append(0))
    for n in range(1, 6):
        commits.queue(change(n)).add_done_callback(lambda _, n=n: settled.append(n))
    assert commits.last is not None and not commits.last.done()
    writes.gate.set()
    await commits.written()
    assert settled == [0, 1, 2, 3, 4, 5]
    assert writes.batches == [["0"], ["1", "2", "3", "4", "5"]]


async def test_a_pruning_goes_alone() -> None:
    writes = Writes()
    commits = GroupCommit(writes.write)
    first = await held_first(writes, commits)
    rest = [commits.queue(change(n, pruned=n == 3)) for n in range(1, 6)]
    writes.gate.set()
    await asyncio.gather(first, *rest)
    assert writes.batches == [["0"], ["1", "2"], ["3"], ["4", "5"]]


async def test_a_refused_write_refuses_every_change_of_its_batch() -> None:
    writes = Writes()
    commits = GroupCommit(writes.write)
    first = await held_first(writes, commits)
    batch = [commits.queue(change(n)) for n in range(1, 4)]
    writes.refused = {"2"}
    writes.gate.set()
    await first
    results = await asyncio.gather(*batch, return_exceptions=True)
    assert all(isinstance(result, StoreError) for result in results)
    await commits.queue(change(4))  # the next batch is written
    assert writes.batches == [["0"], ["1", "2", "3"], ["4"]]


async def test_drained_returns_once_everything_queued_is_written() -> None:
    writes = Writes()
    commits = GroupCommit(writes.write)
    await held_first(writes, commits)
    commits.queue(change(1))
    drained = asyncio.ensure_future(commits.drained())
    await asyncio.sleep(0)  # one turn of the loop: the writer is held
    assert not drained.done()
    writes.gate.set()
    await drained
    assert writes.batches == [["0"], ["1"]]


@pytest.mark.parametrize("queued", [0, 1])
async def test_written_returns_at_once_when_nothing_waits(queued: int) -> None:
    writes = Writes()
    commits = GroupCommit(writes.write)
    for n in range(queued):
        await commits.queue(change(n))
    await commits.written()
    assert len(writes.batches) == queued
