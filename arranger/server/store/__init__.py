"""store: where the server keeps its records, behind one interface (`Store`), chosen by URL.

`sqlite:///var/lib/arranger/arranger.db` is the embedded store (the default: the file
arranger.db in the server's dataDir); `postgresql://user@host/db` is a PostgreSQL database that
several servers may share. Nothing outside this package writes SQL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from arranger.server.store.base import (
    PRUNE_BATCH,
    Batch,
    Fenced,
    HistoryQuery,
    Lease,
    Store,
    StoredRecords,
    StoreError,
    TokenRow,
    Unreachable,
    batch_of,
)
from arranger.server.store.urls import check_url, shown, sqlite_url, store_path

__all__ = [
    "PRUNE_BATCH",
    "Batch",
    "Fenced",
    "HistoryQuery",
    "Lease",
    "Store",
    "StoreError",
    "StoredRecords",
    "TokenRow",
    "Unreachable",
    "batch_of",
    "check_url",
    "on_store",
    "open_store",
    "password_warning",
    "sqlite_url",
    "store_path",
]

T = TypeVar("T")


def password_warning(url: str, where: str) -> str:
    """password_warning: what to say of a store URL given in `where` (a command line, which
    every account reads in ps) that carries a password; "" when it carries none."""
    if shown(url) == url:
        return ""
    return (
        f"warning: the password in {where} is readable by every account on this machine (ps); "
        "keep it in ~/.pgpass (or $PGPASSFILE), or give the URL in $ARRANGER_STORE or the "
        "config file"
    )


async def open_store(
    url: str,
    create: bool = False,
    migrate: bool = True,
    exclusive: bool = False,
    confirmed: bool = False,
) -> Store:
    """open_store opens the store at `url`, brought to this version's schema. With `create`
    a new one is made where there is none; without `migrate` (a command beside a running
    server) it must be of this version already. `exclusive`: a server's own, refused while
    another server holds a SQLite store (PostgreSQL's servers share theirs by its lease).
    An older store is migrated after a backup beside it (SQLite), or only when `confirmed`
    (PostgreSQL, whose backup is pg_dump: arranger-server --migrate)."""
    problem = check_url(url)
    if problem:
        raise StoreError(problem)
    path = store_path(url)
    if path is not None:
        from arranger.server.store.sqlite import SqliteStore  # noqa: PLC0415

        return await SqliteStore.open(path, create=create, migrate=migrate, exclusive=exclusive)
    from arranger.server.store.postgres import PostgresStore  # noqa: PLC0415 (psycopg, if used)

    return await PostgresStore.open(url, create=create, migrate=migrate, confirmed=confirmed)


def on_store(url: str, work: Callable[[Store], Awaitable[T]]) -> T:
    """on_store: what `work` gives on the store at `url`, opened for this call alone, beside a
    server that may be using it (a command on the head node: `arranger token`)."""

    async def run() -> T:
        store = await open_store(url, migrate=False)
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(run())
