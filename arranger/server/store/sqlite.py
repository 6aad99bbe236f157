"""sqlite: the embedded store, one SQLite file in WAL mode with synchronous=FULL.

One thread owns the one connection; every transaction, read or write, is a single function run
in that thread, so a commit costs the event loop one hand-off however many statements it holds.
Other processes on the head node (`arranger token`, `--backup`) may open the same file: WAL
lets a second writer in for a short transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import structlog

from arranger.server.effects import Pruning
from arranger.server.history import HistoryRecord
from arranger.server.model import EventRecord, JobRecord, NodeRecord
from arranger.server.queues import QueueRecord
from arranger.server.store import rows
from arranger.server.store.base import (
    NEW_CLUSTER,
    PACKAGE_CHUNK_BYTES,
    PRUNE_BATCH,
    Batch,
    HistoryQuery,
    SpecLoader,
    Store,
    StoredRecords,
    StoreError,
    TokenRow,
    owned_by,
    prune_package_statements,
    prune_statements,
    read_chunks,
    sorted_pods,
    version_problem,
)
from arranger.server.store.server_lock import hold_directory
from arranger.server.store.sqlite_schema import MIGRATIONS

RECLAIM_PAGES = 4_096  # free pages given back to the filesystem at a time
log = structlog.get_logger("arranger.server")
T = TypeVar("T")


def _mark(column: str) -> str:
    return f":{column}"


UPSERTS = {table: rows.upsert_sql(table, _mark) for table in rows.TABLES}
INSERT_EVENT = rows.insert_sql("events", rows.EVENT_COLUMNS, _mark)
PRUNE_EVENTS, PRUNE_HISTORY = prune_statements("?")
PRUNE_PACKAGE, PRUNE_OLD_PACKAGES = prune_package_statements("?")
OWN_PACKAGE = "INSERT INTO package_owners (sha256, owner) VALUES (?, ?) ON CONFLICT DO NOTHING"


class SqliteStore(Store):
    """SqliteStore: the store in one SQLite file; use `await SqliteStore.open(path)`."""

    def __init__(self, path: Path, db: sqlite3.Connection, thread: ThreadPoolExecutor) -> None:
        super().__init__(f"sqlite://{path}")
        self.path = path
        self._db = db
        self._thread = thread
        self._identity = _identity(path)  # the file opened: a removed or replaced one is noticed
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
            db, created = await loop.run_in_executor(thread, _connect, path, create, migrate)
        except BaseException:
            if held is not None:
                os.close(held)
            thread.shutdown(wait=False)
            raise
        store = cls(path, db, thread)
        store._held = held
        store.created = created
        store.cluster_id, store.job_key = await store._run(_cluster_id, path)
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
        if not self.broken and _identity(self.path) != self._identity:
            self.broken = (
                f"the store file {self.path} was removed or replaced while the server ran; "
                'nothing more is stored: restore it (README, "Backups") and restart the server'
            )
        if self.broken:
            raise StoreError(self.broken)

    async def _commit(self, batches: list[Batch]) -> None:
        self._check_file()
        try:
            self.pruned_rows = await self._run(_commit, batches, self.pruned_rows)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write store {self.path}: {exc}") from exc

    async def reclaim(self) -> None:
        """reclaim gives free pages back to the filesystem, a bounded number at a time, in a
        store made with incremental auto-vacuum (one made before keeps and reuses them)."""
        await self._read(_reclaim)

    async def backup(self, out: Path) -> str:
        return await self._read(_backup, self.path, out)

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
        return await self._read(_load, spec_loader)

    async def load_queues(self) -> list[QueueRecord]:
        return await self._read(_queues, None)

    async def read_records(
        self,
        job_ids: Iterable[str],
        pod_uids: Iterable[str],
        node_names: Iterable[str],
        queue_names: Iterable[str],
        spec_loader: SpecLoader,
    ) -> StoredRecords:
        wanted = (set(job_ids), set(pod_uids), set(node_names), set(queue_names))
        return await self._read(_records, *wanted, spec_loader)

    async def events(
        self, job_id: str = "", limit: int = 1000, before: int = 0
    ) -> list[EventRecord]:
        return await self._read(_events, job_id, limit, before)

    async def history(self, query: HistoryQuery) -> list[HistoryRecord]:
        return await self._read(_history, query)

    async def finished_without_history(self, since: float) -> list[str]:
        sql = (
            "SELECT id FROM jobs WHERE stage IN ('Succeeded', 'Failed') AND finish_time >= ? "
            "AND NOT EXISTS (SELECT 1 FROM history WHERE history.id = jobs.id)"
        )
        found = await self._read(_select, sql, (since,))
        return [str(row["id"]) for row in found]

    # Tokens.

    async def token_owner(self, digest: str) -> tuple[str, str] | None:
        found = await self._read(_select, "SELECT user, role FROM tokens WHERE hash = ?", (digest,))
        return (str(found[0]["user"]), str(found[0]["role"])) if found else None

    async def known_tokens(self, digests: list[str]) -> set[str]:
        sql = f"SELECT hash FROM tokens WHERE hash IN ({', '.join('?' * len(digests))})"
        return {str(row["hash"]) for row in await self._read(_select, sql, digests)}

    async def add_token(self, name: str, user: str, role: str, digest: str, now: float) -> None:
        sql = "INSERT INTO tokens (name, hash, created, user, role) VALUES (?, ?, ?, ?, ?)"
        try:
            await self._run(_change, sql, (name, digest, now, user, role))
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
            for r in await self._read(_select, sql, ())
        ]

    async def delete_token(self, name: str) -> bool:
        try:
            return await self._run(_change, "DELETE FROM tokens WHERE name = ?", (name,)) > 0
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write store {self.path}: {exc}") from exc

    # Packages.

    async def package_size(self, sha256: str, owner: str | None = None) -> int | None:
        sql, args = "SELECT size FROM packages WHERE sha256 = ? AND complete = 1", [sha256]
        if owner is not None:
            sql, args = f"{sql} AND {owned_by('?')}", [*args, owner]
        found = await self._read(_select, sql, args)
        return int(found[0]["size"]) if found else None

    async def touch_package(self, sha256: str, now: float, owner: str | None = None) -> bool:
        sql = "UPDATE packages SET touched = max(touched, ?) WHERE sha256 = ? AND complete = 1"
        args: list[object] = [now, sha256]
        if owner is not None:
            sql, args = f"{sql} AND {owned_by('?')}", [*args, owner]
        self._check_file()
        try:
            return await self._run(_change, sql, args) > 0
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write store {self.path}: {exc}") from exc

    async def put_package(self, sha256: str, size: int, now: float, path: Path, owner: str) -> bool:
        self._check_file()
        try:
            held = await self._run(_begin_package, sha256, size, now, owner)
            if held is not None:
                return held
            seq = 0
            while seq * PACKAGE_CHUNK_BYTES < size:
                stored = await self._run(_put_chunks, sha256, path, seq)
                if not stored:
                    raise StoreError(f"package file {path} is shorter than {size} bytes")
                seq += stored
            await self._run(_complete_package, sha256, owner)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write store {self.path}: {exc}") from exc
        return True

    async def package_bytes(self, owner: str) -> int:
        sql = f"SELECT sum(size) AS used FROM packages WHERE complete = 1 AND {owned_by('?')}"
        found = await self._read(_select, sql, (owner,))
        return int(found[0]["used"] or 0)

    async def package_chunks(self, sha256: str, size: int) -> AsyncIterator[bytes]:
        sql = "SELECT data FROM package_chunks WHERE sha256 = ? AND seq = ?"
        for seq in range(-(-size // PACKAGE_CHUNK_BYTES)):
            found = await self._read(_select, sql, (sha256, seq))
            if not found:
                raise StoreError(f"package {sha256} lacks its part {seq} in {self.path}")
            yield bytes(found[0]["data"])


# What runs in the store's thread.


def _connect(path: Path, create: bool, migrate: bool) -> tuple[sqlite3.Connection, bool]:
    """_connect opens the file and brings it to this version; True if it had no schema."""
    try:
        _private(path, create)
    except OSError as exc:
        raise StoreError(f"cannot open store {path}: {exc}") from exc
    try:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=5)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open store {path}: {exc}") from exc
    try:
        db.row_factory = sqlite3.Row
        if not create and int(db.execute("PRAGMA user_version").fetchone()[0]) == 0:
            # No schema (an empty file: a copy onto a full disk, a `touch`): made into a new
            # cluster silently, it would strand every pod the old one runs. Asked before
            # anything is written to the file.
            raise StoreError(
                f"store {path} is empty (no schema, no cluster): restore it from a backup "
                '(README, "Backups"), or start arranger-server with --init to make a new cluster'
            )
        if db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
            # A new store can give pages back; this holds only if set before anything is
            # written to the file (switching to WAL writes its header).
            db.execute("PRAGMA auto_vacuum=INCREMENTAL")
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA foreign_keys=ON")
        found = _migrate(db, path, migrate)
    except BaseException as exc:
        db.close()
        if isinstance(exc, sqlite3.Error):
            raise StoreError(f"cannot open store {path}: {exc}") from exc
        raise
    return db, found == 0


def _migrate(db: sqlite3.Connection, path: Path, migrate: bool) -> int:
    """_migrate applies the migrations the store lacks; returns the version it found. A store
    of an older version is first copied beside itself (`arranger.db.v12-<UTC time>.bak`):
    migrations go one way, and that copy is what an older release can run on again. A new
    store gets NEW_CLUSTER with its last migration."""
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    problem = version_problem(str(path), version, len(MIGRATIONS), migrate)
    if problem:
        raise StoreError(problem)
    if 0 < version < len(MIGRATIONS):
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        said = _backup(db, path, path.with_name(f"{path.name}.v{version}-{stamp}.bak"))
        log.warning(
            "store of an older release: backed up before migrating",
            backup=said,
            version=version,
            to=len(MIGRATIONS),
        )
    for number in range(version, len(MIGRATIONS)):
        made = NEW_CLUSTER if version == 0 and number == len(MIGRATIONS) - 1 else ""
        script = (
            f"BEGIN IMMEDIATE;\n{MIGRATIONS[number]}\n{made}\n"
            f"PRAGMA user_version = {number + 1};\nCOMMIT;"
        )
        try:
            db.executescript(script)
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise StoreError(f"cannot migrate store {path} to version {number + 1}: {exc}") from exc
    return version


def _cluster_id(db: sqlite3.Connection, path: Path) -> tuple[str, str]:
    row = db.execute("SELECT id, job_key FROM cluster").fetchone()
    if row is None:
        raise StoreError(f"store {path} has no cluster id: it is damaged")
    return str(row["id"]), str(row["job_key"])


def _commit(db: sqlite3.Connection, batches: list[Batch], pruned_rows: int) -> int:
    """_commit writes the batches in one transaction; returns how many events or history
    records a pruning among them deleted (the most of the two), else `pruned_rows`."""
    db.execute("BEGIN IMMEDIATE")
    try:
        for batch in batches:
            for table, written in (
                ("jobs", batch.jobs),
                ("pods", batch.pods),
                ("nodes", batch.nodes),
            ):
                if written:
                    db.executemany(UPSERTS[table], written)
            if batch.events:
                db.executemany(INSERT_EVENT, batch.events)
            if batch.removed_jobs:
                db.executemany("DELETE FROM jobs WHERE id = ?", [(i,) for i in batch.removed_jobs])
            if batch.queues:
                db.executemany(UPSERTS["queues"], batch.queues)
            if batch.removed_queues:
                names = [(name,) for name in batch.removed_queues]
                db.executemany("DELETE FROM queues WHERE name = ?", names)
            if batch.token_uses:
                db.executemany("UPDATE tokens SET last_used = ? WHERE hash = ?", batch.token_uses)
            if batch.pruned is not None:
                pruned_rows = _prune(db, batch.pruned)
            if batch.history:
                db.executemany(UPSERTS["history"], batch.history)
        db.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")
        raise
    return pruned_rows


def _prune(db: sqlite3.Connection, pruned: Pruning) -> int:
    """_prune deletes what retention let go, in the transaction under way: the events of the
    pruned jobs, then (a bounded batch each) events of no job in the store older than
    `events_before` and history records that ended before `history_before`. Returns the
    larger of the two counts."""
    deleted = 0
    if pruned.jobs:
        db.executemany("DELETE FROM events WHERE job_id = ?", [(job,) for job in pruned.jobs])
    if pruned.events_before is not None:
        cursor = db.execute(PRUNE_EVENTS, (pruned.events_before, PRUNE_BATCH))
        deleted = max(deleted, cursor.rowcount)
    if pruned.history_before is not None:
        cursor = db.execute(PRUNE_HISTORY, (pruned.history_before, PRUNE_BATCH))
        deleted = max(deleted, cursor.rowcount)
    db.executemany(PRUNE_PACKAGE, [(sha256,) for sha256 in pruned.packages])
    if pruned.packages_before is not None:
        db.execute(PRUNE_OLD_PACKAGES, (pruned.packages_before,))
    return deleted


def _begin_package(
    db: sqlite3.Connection, sha256: str, size: int, now: float, owner: str
) -> bool | None:
    """_begin_package starts storing a package (again, over any part stored before): None.
    If it is held complete already, it is uploaded `now` and `owner`'s: whether it was not
    `owner`'s before."""
    with _transaction(db):
        row = db.execute("SELECT complete FROM packages WHERE sha256 = ?", (sha256,)).fetchone()
        if row is not None and row["complete"]:
            db.execute(
                "UPDATE packages SET touched = max(touched, ?) WHERE sha256 = ?", (now, sha256)
            )
            return db.execute(OWN_PACKAGE, (sha256, owner)).rowcount > 0
        db.execute("DELETE FROM packages WHERE sha256 = ?", (sha256,))
        db.execute(
            "INSERT INTO packages (sha256, size, touched, complete) VALUES (?, ?, ?, 0)",
            (sha256, size, now),
        )
    return None


def _complete_package(db: sqlite3.Connection, sha256: str, owner: str) -> None:
    """_complete_package marks a package whose rows are all stored complete, and `owner`'s."""
    with _transaction(db):
        db.execute("UPDATE packages SET complete = 1 WHERE sha256 = ?", (sha256,))
        db.execute(OWN_PACKAGE, (sha256, owner))


def _put_chunks(db: sqlite3.Connection, sha256: str, path: Path, first: int) -> int:
    """_put_chunks stores the next rows of a package from its file, from row `first`, in one
    transaction; returns how many."""
    rows = read_chunks(path, first)
    with _transaction(db):
        db.executemany(
            "INSERT INTO package_chunks (sha256, seq, data) VALUES (?, ?, ?)",
            [(sha256, first + i, data) for i, data in enumerate(rows)],
        )
    return len(rows)


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    """_transaction: one write transaction, committed at the end or rolled back."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")
        raise


def _reclaim(db: sqlite3.Connection) -> None:
    db.execute(f"PRAGMA incremental_vacuum({RECLAIM_PAGES})").fetchall()


def _select(db: sqlite3.Connection, sql: str, args: Any) -> list[sqlite3.Row]:
    return db.execute(sql, args).fetchall()


def _change(db: sqlite3.Connection, sql: str, args: Any) -> int:
    """_change runs one statement as its own transaction; returns the rows it changed."""
    with db:  # commits, or rolls back on an error
        return db.execute(sql, args).rowcount


def _load(
    db: sqlite3.Connection, spec_loader: SpecLoader
) -> tuple[list[JobRecord], list[NodeRecord]]:
    db.execute("BEGIN")  # one snapshot of every table
    try:
        jobs = {
            row["id"]: rows.job_from(row, spec_loader(row["spec"]))
            for row in db.execute("SELECT * FROM jobs ORDER BY submit_time, id")
        }
        pods = map(rows.pod_from, db.execute("SELECT * FROM pods ORDER BY job_id, rowid"))
        loaded = sorted_pods(jobs, pods)
        nodes = [rows.node_from(row) for row in db.execute("SELECT * FROM nodes ORDER BY name")]
    finally:
        db.execute("COMMIT")
    return loaded, nodes


def _queues(db: sqlite3.Connection, names: set[str] | None) -> list[QueueRecord]:
    queues = [rows.queue_from(row) for row in db.execute("SELECT * FROM queues ORDER BY name")]
    return queues if names is None else [q for q in queues if q.name in names]


def _records(
    db: sqlite3.Connection,
    job_ids: set[str],
    pod_uids: set[str],
    node_names: set[str],
    queue_names: set[str],
    spec_loader: SpecLoader,
) -> StoredRecords:
    found = StoredRecords()
    for job_id in job_ids:
        row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is not None:
            found.jobs[job_id] = rows.job_from(row, spec_loader(row["spec"]))
    for uid in pod_uids:
        row = db.execute("SELECT * FROM pods WHERE uid = ?", (uid,)).fetchone()
        if row is not None:
            found.pods[uid] = rows.pod_from(row)
    for name in node_names:
        row = db.execute("SELECT * FROM nodes WHERE name = ?", (name,)).fetchone()
        if row is not None:
            found.nodes[name] = rows.node_from(row)
    found.queues = {q.name: q for q in _queues(db, queue_names)}
    return found


def _events(db: sqlite3.Connection, job_id: str, limit: int, before: int) -> list[EventRecord]:
    args: list[object] = [before or rows.NO_EVENT_ID, limit]
    where = "id < ?"
    if job_id:
        where, args = "job_id = ? AND id < ?", [job_id, *args]
    sql = f"SELECT * FROM events WHERE {where} ORDER BY id DESC LIMIT ?"
    return [rows.event_from(row) for row in reversed(db.execute(sql, args).fetchall())]


def _history(db: sqlite3.Connection, query: HistoryQuery) -> list[HistoryRecord]:
    where, args = ["(end_time, id) > (?, ?)", "end_time < ?"], [*query.after, query.until]
    for column, value in (("owner", query.user), ("queue", query.queue), ("name", query.name)):
        if value:
            where.append(f"{column} = ?")
            args.append(value)
    sql = f"SELECT * FROM history WHERE {' AND '.join(where)} ORDER BY end_time, id LIMIT ?"
    return [rows.history_from(row) for row in db.execute(sql, [*args, query.limit])]


def _backup(db: sqlite3.Connection, path: Path, out: Path) -> str:
    """_backup copies the store with SQLite's online backup: a consistent copy even while the
    server writes, readable by its owner only. To restore, stop the server and put the copy in
    place of arranger.db (removing arranger.db-wal and -shm)."""
    if out.exists():
        raise StoreError(f"{out} exists: the backup never overwrites a file")
    out.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    try:
        with contextlib.closing(sqlite3.connect(out)) as copy:
            db.backup(copy)
            (check,) = copy.execute("PRAGMA quick_check").fetchone()
            if check != "ok":
                raise StoreError(f"the copy of {path} does not check out: {check}")
            has_id = copy.execute(
                "SELECT count(*) FROM sqlite_master WHERE name = 'cluster'"
            ).fetchone()[0]  # a store older than cluster ids has none
            cluster = copy.execute("SELECT id FROM cluster").fetchone()[0] if has_id else "-"
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    return f"store {path} (cluster {cluster}) copied to {out}"


def _identity(path: Path) -> tuple[int, int] | None:
    """_identity: the file at `path` (device, inode), None if there is none."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _private(path: Path, create: bool) -> None:
    """_private makes the store's directory 0700 and its files (SQLite gives its WAL and shared
    memory files the database's mode) 0600. Without `create` the store must exist."""
    if not create and not path.exists():
        raise StoreError(
            f"no store at {path}: start arranger-server with --init to create one "
            "(it never makes one by itself, so that a wrong dataDir or an unmounted disk "
            "cannot pass for an empty cluster)"
        )
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(file, 0o600)
