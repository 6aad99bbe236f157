"""postgres_writes: a batch's rows and retention's deletions as PostgreSQL statements, run on a
cursor of the write transaction under way (see PostgresStore._commit). Row lists go through
executemany, which psycopg pipelines into one round trip.
"""

from __future__ import annotations

from typing import Any

import psycopg

from arranger.server.effects import Pruning
from arranger.server.store.base import PRUNE_BATCH, Batch
from arranger.server.store.rows import EVENT_COLUMNS, TABLES, insert_sql, upsert_sql
from arranger.server.store.sql import (
    orphan_experiment,
    prune_package_statements,
    prune_statements,
    report_statements,
)


def _mark(column: str) -> str:
    return f"%({column})s"


UPSERTS = {table: upsert_sql(table, _mark) for table in TABLES}
INSERT_EVENT = insert_sql("events", EVENT_COLUMNS, _mark)
PRUNE_EVENTS, PRUNE_HISTORY = prune_statements("%s")
PRUNE_PACKAGE, PRUNE_OLD_PACKAGES = prune_package_statements("%s")
ORPHAN_EXPERIMENT = orphan_experiment("%s")
REPORTS = report_statements("%s")


async def write_batch(cur: psycopg.AsyncCursor[Any], batch: Batch) -> int | None:
    """write_batch writes the batch's rows; returns how many events or history records its
    pruning deleted (the most of the two), None if it prunes nothing."""
    pruned_rows = None
    for table, written in (("jobs", batch.jobs), ("pods", batch.pods), ("nodes", batch.nodes)):
        if written:
            await cur.executemany(UPSERTS[table], written)
    if batch.experiments:
        await cur.executemany(UPSERTS["experiments"], batch.experiments)
    for statement, rows in zip(REPORTS, batch.report_rows(), strict=True):
        if rows:
            await cur.executemany(statement, rows)
    if batch.events:
        await cur.executemany(INSERT_EVENT, batch.events)
    if batch.removed_jobs:
        await cur.execute("DELETE FROM jobs WHERE id = ANY(%s)", (batch.removed_jobs,))
    if batch.left_experiments:
        await cur.executemany(ORPHAN_EXPERIMENT, [(e, e) for e in batch.left_experiments])
    if batch.queues:
        await cur.executemany(UPSERTS["queues"], batch.queues)
    if batch.removed_queues:
        await cur.execute("DELETE FROM queues WHERE name = ANY(%s)", (batch.removed_queues,))
    if batch.token_uses:
        await cur.executemany("UPDATE tokens SET last_used = %s WHERE hash = %s", batch.token_uses)
    if batch.pruned is not None:
        pruned_rows = await _prune(cur, batch.pruned)
    if batch.history:
        await cur.executemany(UPSERTS["history"], batch.history)
    return pruned_rows


async def _prune(cur: psycopg.AsyncCursor[Any], pruned: Pruning) -> int:
    """_prune deletes what retention let go (see the SQLite store's, sqlite_transactions):
    returns the larger count of events and history records deleted."""
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
