"""postgres_lease: the lease of a shared PostgreSQL store (see base.Lease) as SQL on its one row:
taken once it lapsed, renewed, released, read, and the fence that each write of its holder
passes. Times are the database's clock, so the servers sharing it need not agree on theirs.
"""

from __future__ import annotations

from typing import Any

import psycopg

from arranger.server.store.base import Lease
from arranger.server.store.postgres_database import Connection

LEASE_LOCK_TIMEOUT_MS = 1_000  # a takeover waits this long for a write under way to commit
LEASE_COLUMNS = "holder, epoch, extract(epoch FROM expires - clock_timestamp()) AS remaining_s"
READ = f"SELECT {LEASE_COLUMNS} FROM lease"
# TAKE: the new epoch is the database's clock in milliseconds (or one more than the last, if
# that is larger), so it grows even past a database restored from a backup that holds an older
# epoch than the agents remember.
TAKE = (
    "UPDATE lease SET holder = %s, epoch = greatest(epoch + 1, "
    "(extract(epoch FROM clock_timestamp()) * 1000)::bigint), "
    "expires = clock_timestamp() + make_interval(secs => %s) "
    f"WHERE id = 1 AND expires <= clock_timestamp() RETURNING {LEASE_COLUMNS}"
)
RENEW = (
    "UPDATE lease SET expires = clock_timestamp() + make_interval(secs => %s) "
    f"WHERE id = 1 AND epoch = %s RETURNING {LEASE_COLUMNS}"
)
RELEASE = "UPDATE lease SET expires = to_timestamp(0) WHERE id = 1 AND epoch = %s"
# STALE_WRITERS ends the sessions that hold the lease row in a write (FOR KEY SHARE, see fence)
# once the lease has lapsed: a server frozen or cut off in the middle of a pipelined write is
# not idle in its transaction as the database sees it, so nothing else would ever end it, and
# a takeover would wait on its lock for good. Its write was never acknowledged; it is rolled
# back.
STALE_WRITERS = (
    "SELECT pg_terminate_backend(l.pid) AS ended FROM pg_locks l "
    "WHERE l.locktype = 'relation' AND l.relation = 'lease'::regclass "
    "AND l.mode = 'RowShareLock' AND l.granted AND l.pid <> pg_backend_pid() "
    "AND EXISTS (SELECT 1 FROM lease WHERE expires <= clock_timestamp())"
)


async def take(db: Connection, holder: str, ttl_s: float) -> tuple[dict[str, Any] | None, bool]:
    """take takes the lease for `holder` for `ttl_s` if it lapsed, in the transaction under
    way: the lease's row as it now is, and whether this call took it. The row is locked FOR
    UPDATE first, waiting at most LEASE_LOCK_TIMEOUT_MS for a write that holds it (see
    fence): psycopg.errors.LockNotAvailable past that."""
    await db.execute(f"SET LOCAL lock_timeout = {LEASE_LOCK_TIMEOUT_MS}")
    await db.execute("SELECT 1 FROM lease WHERE id = 1 FOR UPDATE")
    row = await (await db.execute(TAKE, (holder, ttl_s))).fetchone()
    if row is not None:
        return row, True
    return await (await db.execute(READ)).fetchone(), False


async def fence(cur: psycopg.AsyncCursor[Any], epoch: int) -> str:
    """fence: why the holder of the lease at `epoch` may not write ("" if it may: the lease is
    still of that epoch). The row is locked (KEY SHARE) until the transaction ends: a server
    taking the lease over locks it FOR UPDATE first, so it waits for this write to commit,
    and this server's next write sees the new epoch; a renewal (a plain UPDATE) does not
    wait."""
    await cur.execute("SELECT holder, epoch FROM lease WHERE id = 1 FOR KEY SHARE")
    row = await cur.fetchone()
    if row is not None and int(row["epoch"]) == epoch:
        return ""
    holder, taken = (row["holder"], row["epoch"]) if row else ("", "?")
    return (
        f"this server's lease (epoch {epoch}) was taken over by {holder} (epoch {taken}): it "
        "writes nothing more"
    )


def lease_of(row: dict[str, Any] | None) -> Lease:
    """lease_of: the lease as its row (LEASE_COLUMNS) holds it."""
    assert row is not None, "the lease row is made with the schema and never deleted"
    return Lease(str(row["holder"]), int(row["epoch"]), float(row["remaining_s"]))
