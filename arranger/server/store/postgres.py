"""postgres: the store in a PostgreSQL database that several servers may share (psycopg 3).

Two connections: one writes (every transaction under one lock, so a group commit never
interleaves with a token change), one reads (autocommit; a whole load is one repeatable-read
snapshot). A connection that broke (the database restarted, the network dropped) is opened
again on the next call; the call that found it broken fails as a StoreError, so the server puts
memory back as the store holds it. Credentials come as libpq takes them: the URL, PGPASSWORD,
~/.pgpass, a service file; the URL the server logs never shows a password.

Why psycopg 3 rather than asyncpg: it is libpq underneath, so every way administrators already
configure PostgreSQL access (.pgpass, service files, sslmode, Kerberos) works unchanged; one
library serves the server (async) and the head node's commands (the same API); executemany is
pipelined into one round trip, which is what a batch of rows needs; and it ships as a binary
wheel that needs no compiler or system libpq. asyncpg is faster per call, which a store that
writes one transaction per batch does not need.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any

try:
    import psycopg
    from psycopg.rows import dict_row
except ImportError as exc:  # pragma: no cover (the postgres extra is not installed)
    raise ImportError(
        "a postgresql:// store needs psycopg: pip install 'arranger[postgres]'"
    ) from exc

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
    Fenced,
    HistoryQuery,
    Lease,
    SpecLoader,
    Store,
    StoredRecords,
    StoreError,
    TokenRow,
    Unreachable,
    owned_by,
    prune_package_statements,
    prune_statements,
    read_chunks,
    sorted_pods,
    version_problem,
)
from arranger.server.store.postgres_schema import MIGRATIONS

log = structlog.get_logger()
Connection = psycopg.AsyncConnection[dict[str, Any]]
CONNECT_TIMEOUT_S = 10
MIGRATION_LOCK = 0x617272616E676572  # "arranger": the advisory lock servers migrate under
IDLE_IN_TRANSACTION_MS = 5_000
LEASE_LOCK_TIMEOUT_MS = 1_000  # a takeover waits this long for a write under way to commit
LEASE_COLUMNS = "holder, epoch, extract(epoch FROM expires - clock_timestamp()) AS remaining_s"


def _mark(column: str) -> str:
    return f"%({column})s"


UPSERTS = {table: rows.upsert_sql(table, _mark) for table in rows.TABLES}
INSERT_EVENT = rows.insert_sql("events", rows.EVENT_COLUMNS, _mark)
PRUNE_EVENTS, PRUNE_HISTORY = prune_statements("%s")
PRUNE_PACKAGE, PRUNE_OLD_PACKAGES = prune_package_statements("%s")
OWN_PACKAGE = "INSERT INTO package_owners (sha256, owner) VALUES (%s, %s) ON CONFLICT DO NOTHING"


def shown(url: str) -> str:
    """shown: the URL without a password (in its user part or a `password=` parameter), as
    logs and messages may say it."""
    return _QUERY_PASSWORD.sub(r"\1password=***", _USER_PASSWORD.sub(r"\1:***@", url))


_USER_PASSWORD = re.compile(r"^([a-z]+://[^:/@?#]*):[^@/?#]*@", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"([?&])password=[^&#]*", re.IGNORECASE)


class PostgresStore(Store):
    """PostgresStore: the store in a PostgreSQL database; use `await PostgresStore.open(url)`.
    Several servers may share it (see Store and Lease)."""

    shared = True

    def __init__(self, url: str) -> None:
        super().__init__(shown(url))
        self._dsn = url
        self._reader_conn: Connection | None = None
        # The lease has a connection of its own, so that a renewal never queues behind a
        # large write (or a write behind a renewal).
        self._writes = _Session()
        self._leases = _Session()
        self._packages = _Session()  # so that a large package never holds up other writes
        self._renewer: psycopg.Connection[dict[str, Any]] | None = None  # the lease's thread's
        self._renewals = threading.Lock()

    @classmethod
    async def open(
        cls, url: str, create: bool = False, migrate: bool = True, confirmed: bool = False
    ) -> PostgresStore:
        """open connects to the database at `url` and brings it to this version's schema (a
        database with no tables gets them only with `create`: it never makes a cluster by
        itself); without `migrate` it must be of this version already. A database of an older
        version is migrated only when `confirmed` (arranger-server --migrate): migrations go one
        way, and the backup (pg_dump) is the operator's to take first."""
        store = cls(url)
        try:
            async with store._writing() as db:
                await db.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                store.created = await _migrate(db, store.url, create, migrate, confirmed)
                row = await (await db.execute("SELECT id, job_key FROM cluster")).fetchone()
            if row is None:
                raise StoreError(f"store {store.url} has no cluster id: it is damaged")
            store.cluster_id, store.job_key = str(row["id"]), str(row["job_key"])
        except BaseException:
            await store._close()
            raise
        return store

    async def _connect(self) -> Connection:
        """_connect opens a connection. A transaction of it left idle for IDLE_IN_TRANSACTION
        (its server frozen or cut off mid-transaction) is ended by the database: the locks it
        holds (the lease row's, see _commit) never keep a standby from taking over."""
        try:
            return await psycopg.AsyncConnection.connect(
                self._dsn,
                autocommit=True,
                row_factory=dict_row,
                connect_timeout=CONNECT_TIMEOUT_S,
                application_name="arranger-server",
                options=f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}",
            )
        except psycopg.OperationalError as exc:  # no database server there now
            raise Unreachable(f"cannot open store {self.url}: {_said(exc)}") from exc
        except psycopg.Error as exc:
            raise StoreError(f"cannot open store {self.url}: {_said(exc)}") from exc

    @contextlib.asynccontextmanager
    async def _writing(self, session: _Session | None = None) -> AsyncIterator[Connection]:
        """_writing: a writing connection (the writer's, or `session`'s) inside one
        transaction, alone."""
        session = session or self._writes
        async with session.lock:
            if session.conn is None or session.conn.closed:
                session.conn = await self._connect()
            db = session.conn
            try:
                async with db.transaction():
                    yield db
            except psycopg.Error as exc:
                raise StoreError(f"cannot write store {self.url}: {_said(exc)}") from exc

    async def _reading(self) -> Connection:
        if self._reader_conn is None or self._reader_conn.closed:
            self._reader_conn = await self._connect()
        return self._reader_conn

    async def _select(self, sql: str, args: Sequence[Any] = ()) -> list[dict[str, Any]]:
        db = await self._reading()
        try:
            return await (await db.execute(sql, args)).fetchall()
        except psycopg.Error as exc:
            raise StoreError(f"cannot read store {self.url}: {_said(exc)}") from exc

    async def _close(self) -> None:
        for db in (self._writes.conn, self._leases.conn, self._packages.conn, self._reader_conn):
            if db is not None:
                with contextlib.suppress(psycopg.Error):
                    await db.close()
        with self._renewals:
            if self._renewer is not None:
                self._renewer.close()

    # Writing.

    async def _commit(self, batches: list[Batch]) -> None:
        if self.broken:
            raise StoreError(self.broken)
        async with self._writing() as db, db.cursor() as cur:
            await self._fence(cur)
            for batch in batches:
                await self._write(cur, batch)

    async def _fence(self, cur: psycopg.AsyncCursor[Any]) -> None:
        """_fence: a store that took the lease writes only while the lease is of its epoch.
        The row is locked (KEY SHARE) until the transaction ends: a server taking the lease
        over locks it FOR UPDATE first, so it waits for this write to commit, and this
        server's next write sees the new epoch; a renewal (a plain UPDATE) does not wait."""
        if self.epoch is None:
            return
        await cur.execute("SELECT holder, epoch FROM lease WHERE id = 1 FOR KEY SHARE")
        row = await cur.fetchone()
        if row is None or int(row["epoch"]) != self.epoch:
            holder, epoch = (row["holder"], row["epoch"]) if row else ("", "?")
            self.broken = (
                f"this server's lease (epoch {self.epoch}) was taken over by {holder} (epoch "
                f"{epoch}): it writes nothing more"
            )
            raise Fenced(self.broken)

    async def _write(self, cur: psycopg.AsyncCursor[Any], batch: Batch) -> None:
        for table, written in (("jobs", batch.jobs), ("pods", batch.pods), ("nodes", batch.nodes)):
            if written:
                await cur.executemany(UPSERTS[table], written)
        if batch.events:
            await cur.executemany(INSERT_EVENT, batch.events)
        if batch.removed_jobs:
            await cur.execute("DELETE FROM jobs WHERE id = ANY(%s)", (batch.removed_jobs,))
        if batch.queues:
            await cur.executemany(UPSERTS["queues"], batch.queues)
        if batch.removed_queues:
            await cur.execute("DELETE FROM queues WHERE name = ANY(%s)", (batch.removed_queues,))
        if batch.token_uses:
            await cur.executemany(
                "UPDATE tokens SET last_used = %s WHERE hash = %s", batch.token_uses
            )
        if batch.pruned is not None:
            self.pruned_rows = await _prune(cur, batch.pruned)
        if batch.history:
            await cur.executemany(UPSERTS["history"], batch.history)

    async def reclaim(self) -> None:
        """reclaim: PostgreSQL's autovacuum gives space back by itself."""

    # The lease.

    async def take_lease(self, holder: str, ttl_s: float) -> Lease:
        """take_lease: the new epoch is the database's clock in milliseconds (or one more than
        the last, if that is larger), so it grows even past a database restored from a backup
        that holds an older epoch than the agents remember."""
        sql = (
            "UPDATE lease SET holder = %s, epoch = greatest(epoch + 1, "
            "(extract(epoch FROM clock_timestamp()) * 1000)::bigint), "
            "expires = clock_timestamp() + make_interval(secs => %s) "
            f"WHERE id = 1 AND expires <= clock_timestamp() RETURNING {LEASE_COLUMNS}"
        )
        try:
            async with self._writing(self._leases) as db:
                await db.execute(f"SET LOCAL lock_timeout = {LEASE_LOCK_TIMEOUT_MS}")
                await db.execute("SELECT 1 FROM lease WHERE id = 1 FOR UPDATE")  # see _fence
                row = await (await db.execute(sql, (holder, ttl_s))).fetchone()
                if row is None:
                    row = await (await db.execute(f"SELECT {LEASE_COLUMNS} FROM lease")).fetchone()
                else:
                    self.epoch = int(row["epoch"])
        except StoreError as exc:
            if not isinstance(exc.__cause__, psycopg.errors.LockNotAvailable):
                raise
            await self._end_stale_writers()
            found = await self._select(f"SELECT {LEASE_COLUMNS} FROM lease")
            row = found[0] if found else None
        return _lease(row)

    async def _end_stale_writers(self) -> None:
        """_end_stale_writers ends the sessions that hold the lease row in a write (FOR KEY
        SHARE, see _fence) once the lease has lapsed: a server frozen or cut off in the middle of a
        pipelined write is not idle in its transaction as the database sees it, so nothing
        else would ever end it, and a takeover would wait on its lock for good. Its write was
        never acknowledged; it is rolled back."""
        ended = await self._select(
            "SELECT pg_terminate_backend(l.pid) AS ended FROM pg_locks l "
            "WHERE l.locktype = 'relation' AND l.relation = 'lease'::regclass "
            "AND l.mode = 'RowShareLock' AND l.granted AND l.pid <> pg_backend_pid() "
            "AND EXISTS (SELECT 1 FROM lease WHERE expires <= clock_timestamp())"
        )
        if ended:
            log.warning(
                "ended the session of a server that held the lapsed lease in a write",
                sessions=len(ended),
            )

    def renew_lease_now(self, ttl_s: float) -> Lease | None:
        if self.epoch is None:
            return None
        sql = (
            "UPDATE lease SET expires = clock_timestamp() + make_interval(secs => %s) "
            f"WHERE id = 1 AND epoch = %s RETURNING {LEASE_COLUMNS}"
        )
        with self._renewals:
            try:
                if self._renewer is None or self._renewer.closed:
                    self._renewer = psycopg.connect(
                        self._dsn,
                        autocommit=True,
                        row_factory=dict_row,
                        connect_timeout=CONNECT_TIMEOUT_S,
                        application_name="arranger-server",
                        tcp_user_timeout=int(ttl_s * 1000),  # a dead network fails in a term
                    )
                row = self._renewer.execute(sql, (ttl_s, self.epoch)).fetchone()
            except psycopg.Error as exc:
                if self._renewer is not None:
                    self._renewer.close()
                raise StoreError(f"cannot renew the lease in {self.url}: {_said(exc)}") from exc
        return None if row is None else _lease(row)

    async def release_lease(self) -> None:
        if self.epoch is None or self.broken:
            return
        sql = "UPDATE lease SET expires = to_timestamp(0) WHERE id = 1 AND epoch = %s"
        async with self._writing(self._leases) as db:
            await db.execute(sql, (self.epoch,))

    async def lease(self) -> Lease | None:
        found = await self._select(f"SELECT {LEASE_COLUMNS} FROM lease")
        return _lease(found[0]) if found else None

    # Reading.

    async def load(self, spec_loader: SpecLoader) -> tuple[list[JobRecord], list[NodeRecord]]:
        db = await self._reading()
        try:
            async with db.transaction():  # one snapshot of every table
                await db.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                job_rows = await (
                    await db.execute("SELECT * FROM jobs ORDER BY submit_time, id")
                ).fetchall()
                pod_rows = await (await db.execute("SELECT * FROM pods")).fetchall()
                node_rows = await (await db.execute("SELECT * FROM nodes ORDER BY name")).fetchall()
        except psycopg.Error as exc:
            raise StoreError(f"cannot read store {self.url}: {_said(exc)}") from exc
        # Decoded off the event loop: a large store takes seconds, and the lease is renewed
        # meanwhile (see leadership).
        return await asyncio.to_thread(_records_of, job_rows, pod_rows, node_rows, spec_loader)

    async def load_queues(self) -> list[QueueRecord]:
        return [
            rows.queue_from(r) for r in await self._select("SELECT * FROM queues ORDER BY name")
        ]

    async def read_records(
        self,
        job_ids: Iterable[str],
        pod_uids: Iterable[str],
        node_names: Iterable[str],
        queue_names: Iterable[str],
        spec_loader: SpecLoader,
    ) -> StoredRecords:
        found = StoredRecords()
        for row in await self._select("SELECT * FROM jobs WHERE id = ANY(%s)", (list(job_ids),)):
            found.jobs[row["id"]] = rows.job_from(row, spec_loader(row["spec"]))
        for row in await self._select("SELECT * FROM pods WHERE uid = ANY(%s)", (list(pod_uids),)):
            found.pods[row["uid"]] = rows.pod_from(row)
        sql = "SELECT * FROM nodes WHERE name = ANY(%s)"
        for row in await self._select(sql, (list(node_names),)):
            found.nodes[row["name"]] = rows.node_from(row)
        sql = "SELECT * FROM queues WHERE name = ANY(%s)"
        for row in await self._select(sql, (list(queue_names),)):
            found.queues[row["name"]] = rows.queue_from(row)
        return found

    async def events(
        self, job_id: str = "", limit: int = 1000, before: int = 0
    ) -> list[EventRecord]:
        args: list[object] = [before or rows.NO_EVENT_ID, limit]
        where = "id < %s"
        if job_id:
            where, args = "job_id = %s AND id < %s", [job_id, *args]
        sql = f"SELECT * FROM events WHERE {where} ORDER BY id DESC LIMIT %s"
        return [rows.event_from(row) for row in reversed(await self._select(sql, args))]

    async def history(self, query: HistoryQuery) -> list[HistoryRecord]:
        where = ["(end_time, id) > (%s, %s)", "end_time < %s"]
        args: list[Any] = [*query.after, query.until]
        for column, value in (("owner", query.user), ("queue", query.queue), ("name", query.name)):
            if value:
                where.append(f"{column} = %s")
                args.append(value)
        sql = f"SELECT * FROM history WHERE {' AND '.join(where)} ORDER BY end_time, id LIMIT %s"
        return [rows.history_from(row) for row in await self._select(sql, [*args, query.limit])]

    async def finished_without_history(self, since: float) -> list[str]:
        sql = (
            "SELECT id FROM jobs WHERE stage IN ('Succeeded', 'Failed') AND finish_time >= %s "
            "AND NOT EXISTS (SELECT 1 FROM history WHERE history.id = jobs.id)"
        )
        return [str(row["id"]) for row in await self._select(sql, (since,))]

    # Tokens.

    async def token_owner(self, digest: str) -> tuple[str, str] | None:
        found = await self._select('SELECT "user", role FROM tokens WHERE hash = %s', (digest,))
        return (str(found[0]["user"]), str(found[0]["role"])) if found else None

    async def known_tokens(self, digests: list[str]) -> set[str]:
        found = await self._select("SELECT hash FROM tokens WHERE hash = ANY(%s)", (digests,))
        return {str(row["hash"]) for row in found}

    async def add_token(self, name: str, user: str, role: str, digest: str, now: float) -> None:
        sql = 'INSERT INTO tokens (name, hash, created, "user", role) VALUES (%s, %s, %s, %s, %s)'
        try:
            async with self._writing() as db:
                await db.execute(sql, (name, digest, now, user, role))
        except StoreError as exc:
            if isinstance(exc.__cause__, psycopg.errors.UniqueViolation):
                raise StoreError(f"a token named {name!r} exists") from exc
            raise

    async def list_tokens(self) -> list[TokenRow]:
        sql = 'SELECT name, "user", role, created, last_used FROM tokens ORDER BY name'
        return [
            TokenRow(
                str(r["name"]), str(r["user"]), str(r["role"]), float(r["created"]), r["last_used"]
            )
            for r in await self._select(sql)
        ]

    async def delete_token(self, name: str) -> bool:
        async with self._writing() as db:
            cursor = await db.execute("DELETE FROM tokens WHERE name = %s", (name,))
            return cursor.rowcount > 0

    # Packages.

    async def package_size(self, sha256: str, owner: str | None = None) -> int | None:
        sql, args = "SELECT size FROM packages WHERE sha256 = %s AND complete = 1", [sha256]
        if owner is not None:
            sql, args = f"{sql} AND {owned_by('%s')}", [*args, owner]
        found = await self._select(sql, args)
        return int(found[0]["size"]) if found else None

    async def touch_package(self, sha256: str, now: float, owner: str | None = None) -> bool:
        sql = (
            "UPDATE packages SET touched = greatest(touched, %s) WHERE sha256 = %s AND complete = 1"
        )
        args: list[object] = [now, sha256]
        if owner is not None:
            sql, args = f"{sql} AND {owned_by('%s')}", [*args, owner]
        async with self._writing(self._packages) as db:
            return (await db.execute(sql, args)).rowcount > 0

    async def put_package(self, sha256: str, size: int, now: float, path: Path, owner: str) -> bool:
        async with self._writing(self._packages) as db:
            sql = "SELECT complete FROM packages WHERE sha256 = %s FOR UPDATE"
            row = await (await db.execute(sql, (sha256,))).fetchone()
            if row is not None and row["complete"]:
                sql = "UPDATE packages SET touched = greatest(touched, %s) WHERE sha256 = %s"
                await db.execute(sql, (now, sha256))
                return (await db.execute(OWN_PACKAGE, (sha256, owner))).rowcount > 0
            await db.execute("DELETE FROM packages WHERE sha256 = %s", (sha256,))
            await db.execute(
                "INSERT INTO packages (sha256, size, touched, complete) VALUES (%s, %s, %s, 0)",
                (sha256, size, now),
            )
        seq = 0
        while seq * PACKAGE_CHUNK_BYTES < size:
            rows = await asyncio.to_thread(read_chunks, path, seq)
            if not rows:
                raise StoreError(f"package file {path} is shorter than {size} bytes")
            async with self._writing(self._packages) as db, db.cursor() as cur:
                await cur.executemany(
                    "INSERT INTO package_chunks (sha256, seq, data) VALUES (%s, %s, %s)",
                    [(sha256, seq + i, data) for i, data in enumerate(rows)],
                )
            seq += len(rows)
        async with self._writing(self._packages) as db:
            await db.execute("UPDATE packages SET complete = 1 WHERE sha256 = %s", (sha256,))
            await db.execute(OWN_PACKAGE, (sha256, owner))
        return True

    async def package_bytes(self, owner: str) -> int:
        sql = f"SELECT sum(size) AS used FROM packages WHERE complete = 1 AND {owned_by('%s')}"
        found = await self._select(sql, (owner,))
        return int(found[0]["used"] or 0)

    async def package_chunks(self, sha256: str, size: int) -> AsyncIterator[bytes]:
        sql = "SELECT data FROM package_chunks WHERE sha256 = %s AND seq = %s"
        for seq in range(-(-size // PACKAGE_CHUNK_BYTES)):
            found = await self._select(sql, (sha256, seq))
            if not found:
                raise StoreError(f"package {sha256} lacks its part {seq} in {self.url}")
            yield bytes(found[0]["data"])


async def _migrate(db: Connection, url: str, create: bool, migrate: bool, confirmed: bool) -> bool:
    """_migrate applies the migrations the database lacks, in the transaction under way;
    True if it had none (this open made the store, and wrote NEW_CLUSTER)."""
    exists = await (await db.execute("SELECT to_regclass('schema_version') AS t")).fetchone()
    version = 0
    if exists is not None and exists["t"] is not None:
        row = await (await db.execute("SELECT version FROM schema_version")).fetchone()
        version = int(row["version"]) if row else 0
    if version == 0 and not create:
        raise StoreError(
            f"no store at {url}: start arranger-server with --init to create one (it never "
            "makes one by itself, so that a wrong URL cannot pass for an empty cluster)"
        )
    problem = version_problem(url, version, len(MIGRATIONS), migrate)
    if problem:
        raise StoreError(problem)
    if 0 < version < len(MIGRATIONS) and not confirmed:
        raise StoreError(
            f"store {url} has schema version {version}; this arranger's is {len(MIGRATIONS)}: "
            "migrations go one way, so back the database up (pg_dump), then start "
            "arranger-server once with --migrate"
        )
    if version == 0:
        await db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        await db.execute("INSERT INTO schema_version VALUES (0)")
    for number in range(version, len(MIGRATIONS)):
        await db.execute(MIGRATIONS[number])
        await db.execute("UPDATE schema_version SET version = %s", (number + 1,))
    if version == 0:
        await db.execute(NEW_CLUSTER)
    return version == 0


async def _prune(cur: psycopg.AsyncCursor[Any], pruned: Pruning) -> int:
    """_prune deletes what retention let go (see the SQLite store's): returns the larger
    count of events and history records deleted."""
    deleted = 0
    if pruned.jobs:
        await cur.execute("DELETE FROM events WHERE job_id = ANY(%s)", (list(pruned.jobs),))
    if pruned.events_before is not None:
        await cur.execute(PRUNE_EVENTS, (pruned.events_before, PRUNE_BATCH))
        deleted = max(deleted, cur.rowcount)
    if pruned.history_before is not None:
        await cur.execute(PRUNE_HISTORY, (pruned.history_before, PRUNE_BATCH))
        deleted = max(deleted, cur.rowcount)
    if pruned.packages:
        await cur.executemany(PRUNE_PACKAGE, [(sha256,) for sha256 in pruned.packages])
    if pruned.packages_before is not None:
        await cur.execute(PRUNE_OLD_PACKAGES, (pruned.packages_before,))
    return deleted


class _Session:
    """_Session: a connection opened when first needed (and again after it broke), used by
    one transaction at a time."""

    def __init__(self) -> None:
        self.conn: Connection | None = None
        self.lock = asyncio.Lock()


def _records_of(
    job_rows: list[dict[str, Any]],
    pod_rows: list[dict[str, Any]],
    node_rows: list[dict[str, Any]],
    spec_loader: SpecLoader,
) -> tuple[list[JobRecord], list[NodeRecord]]:
    jobs = {row["id"]: rows.job_from(row, spec_loader(row["spec"])) for row in job_rows}
    return sorted_pods(jobs, map(rows.pod_from, pod_rows)), list(map(rows.node_from, node_rows))


def _lease(row: dict[str, Any] | None) -> Lease:
    assert row is not None, "the lease row is made with the schema and never deleted"
    remaining = row["remaining_s"]
    return Lease(str(row["holder"]), int(row["epoch"]), float(remaining))


def _said(exc: psycopg.Error) -> str:
    """_said: the database's own words for an error, on one line."""
    return " ".join(str(exc).split()) or type(exc).__name__
