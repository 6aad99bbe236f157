"""The PostgreSQL store's own rules: its schema version, concurrent servers' migration, URLs
that never show a password, and the lease that elects one active server and fences the others
(a real server: tests/postgres.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from arranger.server.controller import Controller
from arranger.server.convert import spec_from_json
from arranger.server.model import EventRecord
from arranger.server.queues import QueueRecord
from arranger.server.store import Fenced, StoreError, batch_of, open_store, postgres_database, rows
from arranger.server.store.postgres_schema import MIGRATIONS
from tests.conftest import eventually
from tests.postgres import PostgresServer
from tests.server.test_store import submitted


async def test_servers_opening_a_new_database_at_once_make_one_cluster(
    postgres: PostgresServer,
) -> None:
    url = postgres.new_database()
    stores = await asyncio.gather(*(open_store(url, create=True) for _ in range(4)))
    assert len({s.cluster_id for s in stores}) == 1
    assert sum(s.created for s in stores) == 1  # the others waited and found it made
    for store in stores:
        await store.close()


async def test_a_store_from_a_newer_arranger_is_refused(postgres: PostgresServer) -> None:
    import psycopg  # noqa: PLC0415

    url = postgres.new_database()
    await (await open_store(url, create=True)).close()
    with psycopg.connect(url, autocommit=True) as db:
        db.execute("UPDATE schema_version SET version = version + 1")
    with pytest.raises(StoreError, match="upgrade arranger"):
        await open_store(url)


async def test_the_url_shown_never_carries_a_password(postgres: PostgresServer) -> None:
    url = postgres.new_database().replace("postgres@", "postgres:s3cret@")  # trust: ignored
    store = await open_store(url + "?password=an0ther", create=True)
    await store.close()
    assert "s3cret" not in store.url and "an0ther" not in store.url
    assert store.url.startswith("postgresql://postgres:***@127.0.0.1:")
    closed = "postgresql://postgres:s3cret@127.0.0.1:1/x?password=an0ther"
    with pytest.raises(StoreError) as refused:
        await open_store(closed, create=True)
    assert "s3cret" not in str(refused.value) and "an0ther" not in str(refused.value)


async def test_the_lease_elects_one_server_and_fences_the_one_that_lost_it(
    postgres: PostgresServer,
) -> None:
    url = postgres.new_database()
    a, b = await open_store(url, create=True), await open_store(url)
    first = await a.take_lease("head-a:50051", 30.0)
    assert first.holder == "head-a:50051" and first.epoch > 0 and a.epoch == first.epoch
    seen = await b.take_lease("head-b:50051", 30.0)  # held: b is a standby
    assert seen.holder == "head-a:50051" and b.epoch is None and 25 < seen.remaining_s <= 30
    event = batch_of([], [], [], [EventRecord(1.0, "Test", "by a")], {})
    await a.write(event)
    assert (await a.renew_lease(30.0)) is not None
    await a.release_lease()  # a stops cleanly: b need not wait for the term
    taken = await b.take_lease("head-b:50051", 30.0)
    assert taken.holder == "head-b:50051" and taken.epoch > first.epoch and b.epoch == taken.epoch
    with pytest.raises(Fenced, match=rf"taken over by head-b:50051 \(epoch {taken.epoch}\)"):
        await a.write(batch_of([], [], [], [EventRecord(2.0, "Test", "by a, late")], {}))
    assert await a.renew_lease(30.0) is None
    await b.write(batch_of([], [], [], [EventRecord(3.0, "Test", "by b")], {}))
    assert [e.message for e in await b.events()] == ["by a", "by b"]
    for store in (a, b):
        await store.close()


async def test_a_lease_lapses_by_the_database_clock(postgres: PostgresServer) -> None:
    url = postgres.new_database()
    a, b = await open_store(url, create=True), await open_store(url)
    first = await a.take_lease("head-a", 1.0)  # and never renewed: a froze

    async def taken() -> bool:
        return (await b.take_lease("head-b", 30.0)).holder == "head-b"

    await eventually(taken, timeout_s=10, what="b takes the lapsed lease")
    assert b.epoch is not None and b.epoch > first.epoch
    assert await a.renew_lease(30.0) is None
    with pytest.raises(Fenced):
        await a.write(batch_of([], [], [], [EventRecord(1.0, "Test", "")], {}))
    for store in (a, b):
        await store.close()


async def test_the_epoch_outgrows_one_restored_from_a_backup(postgres: PostgresServer) -> None:
    import psycopg  # noqa: PLC0415

    url = postgres.new_database()
    store = await open_store(url, create=True)
    remembered = (await store.take_lease("head-a", 30.0)).epoch  # what agents remember
    await store.release_lease()
    with psycopg.connect(url, autocommit=True) as db:  # as a restore from an old dump would
        db.execute("UPDATE lease SET epoch = 3")
    assert (await store.take_lease("head-a", 30.0)).epoch > remembered
    await store.close()


async def test_a_writer_frozen_mid_write_does_not_hold_a_takeover_back(
    postgres: PostgresServer,
) -> None:
    """A server frozen in the middle of a pipelined write holds the lease row (see _fence),
    and the database does not count it idle in its transaction: once the lease lapsed, the
    server taking over ends that session, whose write was never acknowledged."""
    import psycopg  # noqa: PLC0415

    url = postgres.new_database()
    a, b = await open_store(url, create=True), await open_store(url)
    first = await a.take_lease("head-a", 1.0)
    frozen = psycopg.connect(url, autocommit=True)
    frozen.execute("BEGIN")
    frozen.execute("SELECT epoch FROM lease WHERE id = 1 FOR KEY SHARE")  # as _fence does
    frozen.pgconn.enter_pipeline_mode()
    frozen.pgconn.send_query_params(
        b"INSERT INTO events (time, kind, job_id, job_name, pod, message) "
        b"VALUES (1, 'Test', '', '', '', 'never acknowledged')",
        None,
    )
    frozen.pgconn.flush()  # and nothing more: the server froze here

    async def taken() -> bool:
        return (await b.take_lease("head-b", 30.0)).holder == "head-b"

    await eventually(taken, timeout_s=20, what="b takes the lease past the frozen write")
    assert b.epoch is not None and b.epoch > first.epoch
    assert await b.events() == []  # the frozen write was rolled back
    frozen.pgconn.finish()
    for store in (a, b):
        await store.close()


async def test_a_store_of_the_previous_schema_migrates_to_no_checkpoint_and_no_min_run(
    postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database the previous release made (schema version 5) and wrote a job and a queue
    to, with the columns it knew: migrated, the job has no checkpoint and the queue no
    minRunSeconds, and both are written with them from then on."""
    import psycopg  # noqa: PLC0415

    url = postgres.new_database()
    monkeypatch.setattr(postgres_database, "MIGRATIONS", MIGRATIONS[:5])
    await (await open_store(url, create=True)).close()
    monkeypatch.undo()
    job, _ = submitted(Controller())
    queue = QueueRecord("research", 2.0, max_priority=5)
    added = {"checkpoint_time", "min_run_s", "experiment", "retries", "idle_gpu_stop_s"}

    def old(row: dict[str, Any]) -> dict[str, Any]:
        return {column: value for column, value in row.items() if column not in added}

    with psycopg.connect(url, autocommit=True) as db:
        for table, row in (
            ("jobs", old(rows.job_row(job))),
            ("queues", old(rows.queue_row(queue))),
            *(("pods", rows.pod_row(pod)) for pod in job.pods.values()),
        ):
            db.execute(rows.insert_sql(table, tuple(row), lambda c: f"%({c})s"), row)
    with pytest.raises(StoreError, match=r"back the database up .* with --migrate"):
        await open_store(url)  # migrations go one way: not without the operator's word
    store = await open_store(url, confirmed=True)
    try:
        (loaded,), _ = await store.load(spec_from_json)
        queues = {q.name: q for q in await store.load_queues()}
        assert loaded.checkpoint_time is None and len(loaded.pods) == len(job.pods)
        assert queues["research"] == queue and queues["research"].min_run_s == 0.0
        loaded.checkpoint_time = 1234.5
        kept = dataclasses.replace(queue, min_run_s=600.0)
        await store.write(batch_of([loaded], [], [], [], {}, queues=[kept]))
        (again,), _ = await store.load(spec_from_json)
        assert again.checkpoint_time == 1234.5
        assert {q.name: q for q in await store.load_queues()}["research"] == kept
    finally:
        await store.close()
    with psycopg.connect(url, autocommit=True) as db:
        assert db.execute("SELECT version FROM schema_version").fetchone() == (len(MIGRATIONS),)
