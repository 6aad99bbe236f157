"""postgres: the store in a PostgreSQL database that several servers may share (psycopg 3).

Sessions, each a connection used by one transaction at a time: one writes batches and tokens
(so a batch's write never interleaves with a token change), one the lease, one packages (so a
large one never holds up other writes); one connection reads (autocommit; a whole load is one
repeatable-read snapshot), and the lease's renewals have one of their own, in their thread. A connection that broke (the database restarted, the network dropped) is opened
again on the next call; the call that found it broken fails as a StoreError, so the server puts
memory back as the store holds it. Credentials come as libpq takes them: the URL, PGPASSWORD,
~/.pgpass, a service file; the URL the server logs never shows a password. The connections
and the schema are postgres_database's; the lease's SQL postgres_lease's; a batch's statements
postgres_writes'.

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
import threading
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any

try:
    import psycopg
except ImportError as exc:  # pragma: no cover (the postgres extra is not installed)
    raise ImportError(
        "a postgresql:// store needs psycopg: pip install 'arranger[postgres]'"
    ) from exc

import structlog

from arranger.server.history import HistoryRecord
from arranger.server.model import EventRecord, JobRecord, NodeRecord
from arranger.server.queues import QueueRecord
from arranger.server.store.base import (
    PACKAGE_CHUNK_BYTES,
    Batch,
    Fenced,
    HistoryQuery,
    Lease,
    SpecLoader,
    Store,
    StoredRecords,
    StoreError,
    TokenRow,
)
from arranger.server.store.history_rows import history_from
from arranger.server.store.postgres_database import (
    MIGRATION_LOCK,
    Connection,
    Session,
    connect,
    connect_blocking,
    migrate_schema,
    said,
)
from arranger.server.store.postgres_lease import (
    READ,
    RELEASE,
    RENEW,
    STALE_WRITERS,
    fence,
    lease_of,
    take,
)
from arranger.server.store.postgres_writes import write_batch
from arranger.server.store.rows import (
    NO_EVENT_ID,
    event_from,
    job_from,
    node_from,
    pod_from,
    queue_from,
)
from arranger.server.store.sql import owned_by, read_chunks, sorted_pods
from arranger.server.store.urls import shown

log = structlog.get_logger()
OWN_PACKAGE = "INSERT INTO package_owners (sha256, owner) VALUES (%s, %s) ON CONFLICT DO NOTHING"


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
        self._writes = Session()
        self._leases = Session()
        self._packages = Session()  # so that a large package never holds up other writes
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
                store.created = await migrate_schema(db, store.url, create, migrate, confirmed)
                row = await (await db.execute("SELECT id, job_key FROM cluster")).fetchone()
            if row is None:
                raise StoreError(f"store {store.url} has no cluster id: it is damaged")
            store.cluster_id, store.job_key = str(row["id"]), str(row["job_key"])
        except BaseException:
            await store._close()
            raise
        return store

    @contextlib.asynccontextmanager
    async def _writing(self, session: Session | None = None) -> AsyncIterator[Connection]:
        """_writing: a writing connection (the writer's, or `session`'s) inside one
        transaction, alone."""
        session = session or self._writes
        async with session.lock:
            if session.conn is None or session.conn.closed:
                session.conn = await connect(self._dsn, self.url)
            db = session.conn
            try:
                async with db.transaction():
                    yield db
            except psycopg.Error as exc:
                raise StoreError(f"cannot write store {self.url}: {said(exc)}") from exc

    async def _reading(self) -> Connection:
        if self._reader_conn is None or self._reader_conn.closed:
            self._reader_conn = await connect(self._dsn, self.url)
        return self._reader_conn

    async def _select(self, sql: str, args: Sequence[Any] = ()) -> list[dict[str, Any]]:
        db = await self._reading()
        try:
            return await (await db.execute(sql, args)).fetchall()
        except psycopg.Error as exc:
            raise StoreError(f"cannot read store {self.url}: {said(exc)}") from exc

    async def _close(self) -> None:
        for db in (self._writes.conn, self._leases.conn, self._packages.conn, self._reader_conn):
            if db is not None:
                with contextlib.suppress(psycopg.Error):
                    await db.close()
        with self._renewals:
            if self._renewer is not None:
                self._renewer.close()

    # Writing.

    async def _commit(self, batch: Batch) -> None:
        if self.broken:
            raise StoreError(self.broken)
        async with self._writing() as db, db.cursor() as cur:
            if self.epoch is not None:  # a store that took the lease writes only while it holds
                self.broken = await fence(cur, self.epoch)
                if self.broken:
                    raise Fenced(self.broken)
            pruned_rows = await write_batch(cur, batch)
            if pruned_rows is not None:
                self.pruned_rows = pruned_rows

    async def reclaim(self) -> None:
        """reclaim: PostgreSQL's autovacuum gives space back by itself."""

    # The lease.

    async def take_lease(self, holder: str, ttl_s: float) -> Lease:
        """take_lease: see postgres_lease.take. A takeover that waits on the lease row past
        its lock timeout ends the sessions of writers that hold it once it lapsed (see
        postgres_lease.STALE_WRITERS) and says the lease as it is; the next try takes it."""
        try:
            async with self._writing(self._leases) as db:
                row, taken = await take(db, holder, ttl_s)
                if taken:
                    self.epoch = lease_of(row).epoch
        except StoreError as exc:
            if not isinstance(exc.__cause__, psycopg.errors.LockNotAvailable):
                raise
            ended = await self._select(STALE_WRITERS)
            if ended:
                log.warning(
                    "ended the session of a server that held the lapsed lease in a write",
                    sessions=len(ended),
                )
            found = await self._select(READ)
            row = found[0] if found else None
        return lease_of(row)

    def renew_lease_now(self, ttl_s: float) -> Lease | None:
        if self.epoch is None:
            return None
        with self._renewals:
            try:
                if self._renewer is None or self._renewer.closed:
                    self._renewer = connect_blocking(self._dsn, ttl_s)
                row = self._renewer.execute(RENEW, (ttl_s, self.epoch)).fetchone()
            except psycopg.Error as exc:
                if self._renewer is not None:
                    self._renewer.close()
                raise StoreError(f"cannot renew the lease in {self.url}: {said(exc)}") from exc
        return None if row is None else lease_of(row)

    async def release_lease(self) -> None:
        if self.epoch is None or self.broken:
            return
        async with self._writing(self._leases) as db:
            await db.execute(RELEASE, (self.epoch,))

    async def lease(self) -> Lease | None:
        found = await self._select(READ)
        return lease_of(found[0]) if found else None

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
            raise StoreError(f"cannot read store {self.url}: {said(exc)}") from exc
        # Decoded off the event loop: a large store takes seconds, and the lease is renewed
        # meanwhile (see leadership).
        return await asyncio.to_thread(_records_of, job_rows, pod_rows, node_rows, spec_loader)

    async def load_queues(self) -> list[QueueRecord]:
        return [queue_from(r) for r in await self._select("SELECT * FROM queues ORDER BY name")]

    async def _rows(self, sql: str) -> list[Any]:
        return await self._select(sql)

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
            found.jobs[row["id"]] = job_from(row, spec_loader(row["spec"]))
        for row in await self._select("SELECT * FROM pods WHERE uid = ANY(%s)", (list(pod_uids),)):
            found.pods[row["uid"]] = pod_from(row)
        sql = "SELECT * FROM nodes WHERE name = ANY(%s)"
        for row in await self._select(sql, (list(node_names),)):
            found.nodes[row["name"]] = node_from(row)
        sql = "SELECT * FROM queues WHERE name = ANY(%s)"
        for row in await self._select(sql, (list(queue_names),)):
            found.queues[row["name"]] = queue_from(row)
        return found

    async def events(
        self, job_id: str = "", limit: int = 1000, before: int = 0
    ) -> list[EventRecord]:
        args: list[object] = [before or NO_EVENT_ID, limit]
        where = "id < %s"
        if job_id:
            where, args = "job_id = %s AND id < %s", [job_id, *args]
        sql = f"SELECT * FROM events WHERE {where} ORDER BY id DESC LIMIT %s"
        return [event_from(row) for row in reversed(await self._select(sql, args))]

    async def history(self, query: HistoryQuery) -> list[HistoryRecord]:
        where = ["(end_time, id) > (%s, %s)", "end_time < %s"]
        args: list[Any] = [*query.after, query.until]
        for column, value in query.filters():
            if value:
                where.append(f"{column} = %s")
                args.append(value)
        sql = f"SELECT * FROM history WHERE {' AND '.join(where)} ORDER BY end_time, id LIMIT %s"
        return [history_from(row) for row in await self._select(sql, [*args, query.limit])]

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


def _records_of(
    job_rows: list[dict[str, Any]],
    pod_rows: list[dict[str, Any]],
    node_rows: list[dict[str, Any]],
    spec_loader: SpecLoader,
) -> tuple[list[JobRecord], list[NodeRecord]]:
    """_records_of: the loaded rows as records, each job with its pods."""
    jobs = {row["id"]: job_from(row, spec_loader(row["spec"])) for row in job_rows}
    return sorted_pods(jobs, map(pod_from, pod_rows)), list(map(node_from, node_rows))
