"""Reads of the store see what memory showed: events and history are read from the store, so
ListEvents, ListHistory and the dashboard's job page first wait until every change made before
them is written (`GroupCommit.written`, server.writes). A real server and store on 127.0.0.1; the store's
writes are held at a gate the test opens (no sleep: it waits on conditions with a deadline).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from arranger.client.sdk import AsyncClient
from arranger.server.app import ArrangerServer
from arranger.server.model import EventRecord
from arranger.server.store import Batch
from tests.conftest import bare_server, eventually, job_spec


class Gate:
    """Gate holds the store's writes while closed."""

    def __init__(self, server: ArrangerServer) -> None:
        self.open = asyncio.Event()
        self.open.set()
        self.held = 0
        self._write = server.store.write
        server.store.write = self._gated  # type: ignore[method-assign]

    async def _gated(self, batch: Batch) -> None:
        if not self.open.is_set():
            self.held += 1
            await self.open.wait()
        await self._write(batch)


async def test_a_read_waits_for_every_change_made_before_it(tmp_path: Path) -> None:
    async with bare_server(tmp_path / "server") as server:
        gate = Gate(server)
        try:
            await _read_while_a_stop_is_written(server, gate)
        finally:
            gate.open.set()  # the server's stop waits for its writer


async def _read_while_a_stop_is_written(server: ArrangerServer, gate: Gate) -> None:
    store = server.store
    async with AsyncClient(f"127.0.0.1:{server.port}", timeout_s=10) as client:
        job_id = (await client.submit(job_spec("held", ["true"]))).metadata.id
        await server.writes.written()  # nothing queued: at once
        gate.open.clear()
        stopping = asyncio.create_task(client.stop("held"))  # memory changes, the write waits
        await eventually(lambda: gate.held >= 1, what="the stop's write held at the gate")
        job = server.controller.view.job(job_id)
        assert job is not None and job.terminating  # in memory, not yet in the store
        assert "StopRequested" not in [e.kind for e in await store.events(job_id)]

        reader = asyncio.create_task(server.writes.written())
        await asyncio.sleep(0)  # one turn of the loop: the write it waits for is held
        assert not reader.done()
        gate.open.set()
        await reader
        assert "StopRequested" in [e.kind for e in await store.events(job_id)]
        await stopping
        # Through the API, while another change is held: ListEvents reads the store only
        # once that change is written, and lists it.
        reads: list[bool] = []  # for each read of the events: was the gate open?
        events = store.events

        async def watched_events(
            job: str = "", limit: int = 1000, before: int = 0
        ) -> list[EventRecord]:
            reads.append(gate.open.is_set())
            return await events(job, limit, before)

        store.events = watched_events  # type: ignore[method-assign]
        gate.open.clear()
        deleting = asyncio.create_task(client.delete("held"))
        await eventually(lambda: gate.held >= 2, what="the delete's write held at the gate")
        last = server.writes.last
        assert last is not None
        waiting = _waiters(last)  # the delete's own commit
        listing = asyncio.create_task(client.events())  # every job's
        await eventually(
            lambda: reads or _waiters(last) > waiting, what="ListEvents to wait or to read"
        )
        assert reads == [], "ListEvents read the store before the change it follows was written"
        gate.open.set()
        assert ("Deleted", job_id) in [(e.kind, e.job_id) for e in await listing]
        assert reads == [True]
        await deleting


def _waiters(future: asyncio.Future[None]) -> int:
    """_waiters: how many wait on `future` (asyncio keeps them as its callbacks)."""
    return len(future._callbacks)  # type: ignore[attr-defined]
