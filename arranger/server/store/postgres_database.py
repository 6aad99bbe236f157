"""postgres_database: the PostgreSQL database under a store: its connections, opened when first
needed and again after they broke, with credentials as libpq takes them (the URL, PGPASSWORD,
~/.pgpass, a service file), and its schema, brought to this version's under an advisory lock.
(psycopg is imported first by postgres, which says how to install it where it is missing.)
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from psycopg.rows import dict_row

from arranger.server.store.base import StoreError, Unreachable
from arranger.server.store.postgres_schema import MIGRATIONS
from arranger.server.store.sql import NEW_CLUSTER, version_problem

Connection = psycopg.AsyncConnection[dict[str, Any]]
CONNECT_TIMEOUT_S = 10
MIGRATION_LOCK = 0x617272616E676572  # "arranger": the advisory lock servers migrate under
IDLE_IN_TRANSACTION_MS = 5_000


def said(exc: psycopg.Error) -> str:
    """said: the database's own words for an error, on one line."""
    return " ".join(str(exc).split()) or type(exc).__name__


async def connect(dsn: str, url: str) -> Connection:
    """connect opens a connection to `dsn` (`url` is how messages name it). A transaction of
    it left idle for IDLE_IN_TRANSACTION_MS (its server frozen or cut off mid-transaction) is
    ended by the database: the locks it holds (the lease row's, see postgres_lease.fence)
    never keep a standby from taking over."""
    try:
        return await psycopg.AsyncConnection.connect(
            dsn,
            autocommit=True,
            row_factory=dict_row,
            connect_timeout=CONNECT_TIMEOUT_S,
            application_name="arranger-server",
            options=f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}",
        )
    except psycopg.OperationalError as exc:  # no database server there now
        raise Unreachable(f"cannot open store {url}: {said(exc)}") from exc
    except psycopg.Error as exc:
        raise StoreError(f"cannot open store {url}: {said(exc)}") from exc


def connect_blocking(dsn: str, ttl_s: float) -> psycopg.Connection[dict[str, Any]]:
    """connect_blocking opens a blocking connection, for the lease's renewals from a thread of
    their own (see Store.renew_lease_now); on a dead network its calls fail within `ttl_s`."""
    return psycopg.connect(
        dsn,
        autocommit=True,
        row_factory=dict_row,
        connect_timeout=CONNECT_TIMEOUT_S,
        application_name="arranger-server",
        tcp_user_timeout=int(ttl_s * 1000),
    )


class Session:
    """Session: a connection opened when first needed (and again after it broke), used by
    one transaction at a time."""

    def __init__(self) -> None:
        self.conn: Connection | None = None
        self.lock = asyncio.Lock()


async def migrate_schema(
    db: Connection, url: str, create: bool, migrate: bool, confirmed: bool
) -> bool:
    """migrate_schema applies the migrations the database lacks, in the transaction under way (which
    holds MIGRATION_LOCK); True if it had none (this open made the store, and wrote
    NEW_CLUSTER)."""
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
