"""sqlite: the embedded store, one SQLite file in WAL mode with synchronous=FULL.

One thread owns the one connection; every transaction, read or write, is a single function run
in that thread, so a commit costs the event loop one hand-off however many statements it holds.
Other processes on the head node (`arranger token`, `--backup`) may open the same file: WAL
lets a second writer in for a short transaction. What runs in the thread is sqlite_transactions'
(reads and writes) and sqlite_file's (opening, migrating, backing up).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from arranger.server.history import HistoryRecord
from arranger.server.model import EventRecord, JobRecord, NodeRecord
from arranger.server.queues import QueueRecord
from arranger.server.store.base import (
    PACKAGE_CHUNK_BYTES,
    Batch,
    HistoryQuery,
    SpecLoader,
    Store,
    StoredRecords,
    StoreError,
    TokenRow,
)
from arranger.server.store.server_lock import hold_directory
from arranger.server.store.sql import owned_by
from arranger.server.store.sqlite_file import backup_file, cluster_ids, connect, identity
from arranger.server.store.sqlite_transactions import (
    begin_package,
    change,
    complete_package,
    load_all,
    put_chunks,
    read_events,
    read_history,
    read_queues,
    read_records,
    reclaim_pages,
    select,
    write_batch,
)

T = TypeVar("T")


class SqliteStore(Store):
    """SqliteStore: the store in one SQLite file; use `await SqliteStore.open(path)`."""

    def __init__(self, path: Path, db: sqlite3.Connection, thread: ThreadPoolExecutor) -> None:
        super().__init__(f"sqlite://{path}")
        self.path = path
        self._db = db
        self._thread = thread
        self._identity = identity(path)  # the file opened: a removed or replaced one is noticed
        self._held: int | None = None  # the lock file, held while this server serves the store

    @classmethod
    async def open(
        cls, path: Path, create: bool = False, migrate: bool = True, exclusive: bool = False
    ) -> SqliteStore:
        """open opens the store at `path`, migrating it to this version; with `create` it
        makes one where there is none; without `migrate` (a command beside the server) it
        must be of this version already. Its directory is made 0700 and its files 0600: the
        store holds every job's environment and every token's hash, for the server's user
        alone. `exclusive` (a server): no other server may hold the store's directory, and
        none may until this one is closed or its process is gone (see server_lock); commands
        beside the server (a backup, a token) do not ask."""
        thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-store")
        loop = asyncio.get_running_loop()
        held: int | None = None
        try:
            if exclusive:
                held = await loop.run_in_executor(thread, hold_directory, path, create)
            db, created = await loop.run_in_executor(thread, connect, path, create, migrate)
        except BaseException:
            if held is not None:
                os.close(held)
            thread.shutdown(wait=False)
            raise
        store = cls(path, db, thread)
        store._held = held
        store.created = created
        store.cluster_id, store.job_key = await store._run(cluster_ids, path)
        return store

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """_run runs `fn(connection, *args)` in the store's thread: one transaction."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, functools.partial(fn, self._db, *args))

    async def _close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            await self._run(sqlite3.Connection.close)
        self._thread.shutdown(wait=False)
        if self._held is not None:
            os.close(self._held)  # another server may have the directory now
            self._held = None

    # Writing.

    def _check_file(self) -> None:
        """_check_file: the store's file must still be the one opened. Writes to a removed
        file would be lost at the next start, and a replaced file is another store: either
        way nothing more is written until an operator restores it and restarts the server."""
        if not self.broken and identity(self.path) != self._identity:
            self.broken = (
                f"the store file {self.path} was removed or replaced while the server ran; "
                'nothing more is stored: restore it (README, "Backups") and restart the server'
            )
        if self.broken:
            raise StoreError(self.broken)

    async def _commit(self, batch: Batch) -> None:
        self._check_file()
        try:
            self.pruned_rows = await self._run(write_batch, batch, self.pruned_rows)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write store {self.path}: {exc}") from exc

    async def reclaim(self) -> None:
        """reclaim gives free pages back to the filesystem, a bounded number at a time, in a
        store made with incremental auto-vacuum (one made before keeps and reuses them)."""
        await self._read(reclaim_pages)

    async def backup(self, out: Path) -> str:
        return await self._read(backup_file, self.path, out)

    # Reading.

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await self._run(fn, *args)
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                f"cannot read store {self.path}: {exc} (restore it from a backup: README, "
                '"Backups")'
            ) from exc

    async def load(self, spec_loader: SpecLoader) -> tuple[list[JobRecord], list[NodeRecord]]:
        return await self._read(load_all, spec_loader)

    async def load_queues(self) -> list[QueueRecord]:
        return await self._read(read_queues, None)

    async def _rows(self, sql: str) -> list[Any]:
        return await self._read(select, sql, ())

    async def read_records(
        self,
        job_ids: Iterable[str],
        pod_uids: Iterable[str],
        node_names: Iterable[str],
        queue_names: Iterable[str],
        spec_loader: SpecLoader,
    ) -> StoredRecords:
        wanted = (set(job_ids), set(pod_uids), set(node_names), set(queue_names))
        return await self._read(read_records, *wanted, spec_loader)

    async def events(
        self, job_id: str = "", limit: int = 1000, before: int = 0
    ) -> list[EventRecord]:
        return await self._read(read_events, job_id, limit, before)

    async def history(self, query: HistoryQuery) -> list[HistoryRecord]:
        return await self._read(read_history, query)

    async def finished_without_history(self, since: float) -> list[str]:
        sql = (
            "SELECT id FROM jobs WHERE stage IN ('Succeeded', 'Failed') AND finish_time >= ? "
            "AND NOT EXISTS (SELECT 1 FROM history WHERE history.id = jobs.id)"
        )
        found = await self._read(select, sql, (since,))
        return [str(row["id"]) for row in found]

    # Tokens.

    async def token_owner(self, digest: str) -> tuple[str, str] | None:
        found = await self._read(select, "SELECT user, role FROM tokens WHERE hash = ?", (digest,))
        return (str(found[0]["user"]), str(found[0]["role"])) if found else None

    async def known_tokens(self, digests: list[str]) -> set[str]:
        sql = f"SELECT hash FROM tokens WHERE hash IN ({', '.join('?' * len(digests))})"
        return {str(row["hash"]) for row in await self._read(select, sql, digests)}

    async def add_token(self, name: str, user: str, role: str, digest: str, now: float) -> None:
        sql = "INSERT INTO tokens (name, hash, created, user, role) VALUES (?, ?, ?, ?, ?)"
        try:
            await self._run(change, sql, (name, digest, now, user, role))
        except sqlite3.IntegrityError as exc:
            raise StoreError(f"a token named {name!r} exists") from exc
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write store {self.path}: {exc}") from exc

    async def list_tokens(self) -> list[TokenRow]:
        sql = "SELECT name, user, role, created, last_used FROM tokens ORDER BY name"
        return [
            TokenRow(
                str(r["name"]), str(r["user"]), str(r["role"]), float(r["created"]), r["last_used"]
            )
            for r in await self._read(select, sql, ())
        ]

    async def delete_token(self, name: str) -> bool:
        try:
            return await self._run(change, "DELETE FROM tokens WHERE name = ?", (name,)) > 0
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write store {self.path}: {exc}") from exc

    # Packages.

    async def package_size(self, sha256: str, owner: str | None = None) -> int | None:
        sql, args = "SELECT size FROM packages WHERE sha256 = ? AND complete = 1", [sha256]
        if owner is not None:
            sql, args = f"{sql} AND {owned_by('?')}", [*args, owner]
        found = await self._read(select, sql, args)
        return int(found[0]["size"]) if found else None

    async def touch_package(self, sha256: str, now: float, owner: str | None = None) -> bool:
        sql = "UPDATE packages SET touched = max(touched, ?) WHERE sha256 = ? AND complete = 1"
        args: list[object] = [now, sha256]
        if owner is not None:
            sql, args = f"{sql} AND {owned_by('?')}", [*args, owner]
        self._check_file()
        try:
            return await self._run(change, sql, args) > 0
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write store {self.path}: {exc}") from exc

    async def put_package(self, sha256: str, size: int, now: float, path: Path, owner: str) -> bool:
        self._check_file()
        try:
            held = await self._run(begin_package, sha256, size, now, owner)
            if held is not None:
                return held
            seq = 0
            while seq * PACKAGE_CHUNK_BYTES < size:
                stored = await self._run(put_chunks, sha256, path, seq)
                if not stored:
                    raise StoreError(f"package file {path} is shorter than {size} bytes")
                seq += stored
            await self._run(complete_package, sha256, owner)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write store {self.path}: {exc}") from exc
        return True

    async def package_bytes(self, owner: str) -> int:
        sql = f"SELECT sum(size) AS used FROM packages WHERE complete = 1 AND {owned_by('?')}"
        found = await self._read(select, sql, (owner,))
        return int(found[0]["used"] or 0)

    async def package_chunks(self, sha256: str, size: int) -> AsyncIterator[bytes]:
        sql = "SELECT data FROM package_chunks WHERE sha256 = ? AND seq = ?"
        for seq in range(-(-size // PACKAGE_CHUNK_BYTES)):
            found = await self._read(select, sql, (sha256, seq))
            if not found:
                raise StoreError(f"package {sha256} lacks its part {seq} in {self.path}")
            yield bytes(found[0]["data"])
