"""A job's name is unique among unfinished jobs only: a spec may run again once its job ended.

A name means the unfinished job of that name, or else the newest one; older runs are reached
by id, through every call that takes a job. The store holds the same rule as an index.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from arranger.client.sdk import ArrangerError, AsyncClient
from tests.conftest import bare_server, job_spec


@contextlib.asynccontextmanager
async def served(data_dir: Path) -> AsyncIterator[AsyncClient]:
    """served: a client of a bare server on the store in `data_dir`."""
    async with bare_server(data_dir) as server, AsyncClient(f"127.0.0.1:{server.port}") as c:
        yield c


async def test_a_name_is_reused_once_its_job_has_ended(tmp_path: Path) -> None:
    async with served(tmp_path) as client:
        first = await client.submit(job_spec("again", leader=["true"]))
        with pytest.raises(ArrangerError) as caught:
            await client.submit(job_spec("again", leader=["true"]))
        assert caught.value.code == grpc.StatusCode.ALREADY_EXISTS
        assert first.metadata.id in caught.value.message
        await client.stop("again")  # nothing runs on a bare server: it ends at once
        second = await client.submit(job_spec("again", leader=["true"]))
        assert second.metadata.id != first.metadata.id
        # The name means the newest; the older run is reached by its id.
        assert (await client.get("again")).metadata.id == second.metadata.id
        old = await client.get(first.metadata.id)
        assert old.status.stage == "Succeeded" and old.metadata.name == "again"
        assert [j.id for j in await client.jobs()] == [first.metadata.id, second.metadata.id]
        events = await client.events(first.metadata.id)
        assert {e.job_id for e in events} == {first.metadata.id}
        # Deleting by name deletes the newest; the name then means the older run.
        await client.delete("again")
        assert (await client.get("again")).metadata.id == first.metadata.id
        third = await client.submit(job_spec("again", leader=["true"]))
    with sqlite3.connect(tmp_path / "arranger.db") as db:
        rows = db.execute("SELECT id FROM jobs WHERE name = 'again' AND deleted = 0").fetchall()
    assert sorted(r[0] for r in rows) == sorted([first.metadata.id, third.metadata.id])
    async with served(tmp_path) as client:  # a restart resolves names the same way
        assert (await client.get("again")).metadata.id == third.metadata.id
        with pytest.raises(ArrangerError) as caught:
            await client.submit(job_spec("again", leader=["true"]))
        assert caught.value.code == grpc.StatusCode.ALREADY_EXISTS


async def test_the_store_refuses_two_unfinished_jobs_of_one_name(tmp_path: Path) -> None:
    async with served(tmp_path) as client:
        await client.submit(job_spec("twice", leader=["true"]))
    with sqlite3.connect(tmp_path / "arranger.db") as db:
        row = list(db.execute("SELECT * FROM jobs WHERE name = 'twice'").fetchone())
        row[0] = "another-id"
        marks = ", ".join("?" * len(row))
        with pytest.raises(sqlite3.IntegrityError):
            db.execute(f"INSERT INTO jobs VALUES ({marks})", row)
        db.execute(f"INSERT INTO jobs VALUES ({marks})", [*row[:4], "Failed", *row[5:]])
