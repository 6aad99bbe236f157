"""Retention, through the injected clock: a job finished longer ago than jobRetentionDays is
gone from the live view with its events (and its agents told to purge it), its history record
kept; a record older than historyRetentionDays goes too. Jobs not yet that old stay."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import grpc
import pytest

from arranger.client.sdk import ArrangerError, AsyncClient
from arranger.server.app import ArrangerServer
from arranger.server.store import store_path
from tests.conftest import FAST, job_spec

DAY = 86_400.0


async def finish(client: AsyncClient, name: str) -> None:
    """finish submits a job no node runs (there are none) and stops it: it Succeeds."""
    await client.submit(job_spec(name, ["true"]))
    await client.stop(name)  # stored when it answers
    assert (await client.get(name)).status.stage == "Succeeded"


async def test_retention_prunes_jobs_and_events_then_history(tmp_path: Path) -> None:
    now = [1_800_000_000.0]
    config = dataclasses.replace(FAST, listen="127.0.0.1:0", data_dir=tmp_path / "server")
    server = ArrangerServer(config, clock=lambda: now[0])
    await server.start()
    db = store_path(config.store_url)
    assert db is not None
    try:
        async with AsyncClient(f"127.0.0.1:{server.port}", timeout_s=10) as client:
            await finish(client, "old")
            old_id = (await client.get("old")).metadata.id
            now[0] += 20 * DAY
            await finish(client, "young")
            assert await server.prune() == 0  # nothing is 30 days old yet

            now[0] += 11 * DAY  # old finished 31 days ago, young 11
            assert await server.prune() == 1
            with pytest.raises(ArrangerError) as gone:
                await client.get("old")
            assert gone.value.code == grpc.StatusCode.NOT_FOUND
            assert [j.name for j in await client.jobs()] == ["young"]
            with sqlite3.connect(db) as conn:
                for table, key in (("jobs", "id"), ("pods", "job_id"), ("events", "job_id")):
                    count = conn.execute(f"SELECT count(*) FROM {table} WHERE {key} = ?", (old_id,))
                    assert count.fetchone() == (0,), table
            assert [r.name for r in await client.history()] == ["old", "young"]
            pruned = [e.message for e in await client.events() if e.kind == "Pruned"]
            assert pruned == ["1 finished jobs older than 30 days pruned"]

            now[0] += 366 * DAY - 31 * DAY + 1  # old's record is a year and a second old
            assert await server.prune() == 1  # young's job goes too
            assert [r.name for r in await client.history()] == ["young"]
            assert await client.jobs() == []
    finally:
        await server.stop()
