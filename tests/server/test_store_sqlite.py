"""The SQLite store's own rules: its file, its schema version, and what it refuses."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import pytest

from arranger.server.store import StoreError
from arranger.server.store.sqlite import SqliteStore
from arranger.server.store.sqlite_schema import MIGRATIONS


async def test_the_file_is_private_and_in_wal_mode(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "data" / "a.db", create=True)
    await store.close()
    assert stat.S_IMODE((tmp_path / "data").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "data" / "a.db").stat().st_mode) == 0o600
    with sqlite3.connect(tmp_path / "data" / "a.db") as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert db.execute("PRAGMA auto_vacuum").fetchone() == (2,)  # incremental


async def test_a_store_from_a_newer_arranger_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    with pytest.raises(StoreError, match="upgrade arranger"):
        await SqliteStore.open(path)


async def test_migrations_are_applied_once(tmp_path: Path) -> None:
    await (await SqliteStore.open(tmp_path / "a.db", create=True)).close()
    store = await SqliteStore.open(tmp_path / "a.db", create=True)  # a second open: current
    assert not store.created
    await store.close()
    with sqlite3.connect(tmp_path / "a.db") as db:
        assert db.execute("PRAGMA user_version").fetchone() == (len(MIGRATIONS),)


async def test_a_command_beside_the_server_does_not_migrate(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.executescript(MIGRATIONS[0])
        db.execute("PRAGMA user_version = 1")
    with pytest.raises(StoreError, match="older than this arranger: start the server first"):
        await SqliteStore.open(path, migrate=False)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (1,)
