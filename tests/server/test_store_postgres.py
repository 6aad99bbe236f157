"""The PostgreSQL store's own rules: its schema version, concurrent servers' migration, and
URLs that never show a password (a real server: tests/postgres.py)."""

from __future__ import annotations

import asyncio

import pytest

from arranger.server.store import StoreError, open_store
from tests.postgres import PostgresServer


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
