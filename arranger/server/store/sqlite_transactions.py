"""sqlite_transactions: what runs in the SQLite store's thread, on its one connection: each
function is one transaction (a read, a batch's write, a step of storing a package).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from arranger.server.effects import Pruning
from arranger.server.history import HistoryRecord
from arranger.server.model import EventRecord, JobRecord, NodeRecord
from arranger.server.queues import QueueRecord
from arranger.server.store.base import PRUNE_BATCH, Batch, HistoryQuery, SpecLoader, StoredRecords
from arranger.server.store.history_rows import history_from
from arranger.server.store.rows import (
    EVENT_COLUMNS,
    NO_EVENT_ID,
    TABLES,
    event_from,
    insert_sql,
    job_from,
    node_from,
    pod_from,
    queue_from,
    upsert_sql,
)
from arranger.server.store.sql import (
    orphan_experiment,
    prune_package_statements,
    prune_statements,
    read_chunks,
    report_statements,
    sorted_pods,
)

RECLAIM_PAGES = 4_096  # free pages given back to the filesystem at a time


def _mark(column: str) -> str:
    return f":{column}"


UPSERTS = {table: upsert_sql(table, _mark) for table in TABLES}
INSERT_EVENT = insert_sql("events", EVENT_COLUMNS, _mark)
PRUNE_EVENTS, PRUNE_HISTORY = prune_statements("?")
PRUNE_PACKAGE, PRUNE_OLD_PACKAGES = prune_package_statements("?")
ORPHAN_EXPERIMENT = orphan_experiment("?")
REPORTS = report_statements("?")
OWN_PACKAGE = "INSERT INTO package_owners (sha256, owner) VALUES (?, ?) ON CONFLICT DO NOTHING"


def write_batch(db: sqlite3.Connection, batch: Batch, pruned_rows: int) -> int:
    """write_batch writes the batch in one transaction; returns how many events or history records
    its pruning deleted (the most of the two), else `pruned_rows`."""
    db.execute("BEGIN IMMEDIATE")
    try:
        for table, written in (("jobs", batch.jobs), ("pods", batch.pods), ("nodes", batch.nodes)):
            if written:
                db.executemany(UPSERTS[table], written)
        if batch.experiments:
            db.executemany(UPSERTS["experiments"], batch.experiments)
        for statement, rows in zip(REPORTS, batch.report_rows(), strict=True):
            if rows:
                db.executemany(statement, rows)
        if batch.events:
            db.executemany(INSERT_EVENT, batch.events)
        if batch.removed_jobs:
            db.executemany("DELETE FROM jobs WHERE id = ?", [(i,) for i in batch.removed_jobs])
        if batch.left_experiments:
            db.executemany(ORPHAN_EXPERIMENT, [(e, e) for e in batch.left_experiments])
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


def begin_package(
    db: sqlite3.Connection, sha256: str, size: int, now: float, owner: str
) -> bool | None:
    """begin_package starts storing a package (again, over any part stored before): None.
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


def complete_package(db: sqlite3.Connection, sha256: str, owner: str) -> None:
    """complete_package marks a package whose rows are all stored complete, and `owner`'s."""
    with _transaction(db):
        db.execute("UPDATE packages SET complete = 1 WHERE sha256 = ?", (sha256,))
        db.execute(OWN_PACKAGE, (sha256, owner))


def put_chunks(db: sqlite3.Connection, sha256: str, path: Path, first: int) -> int:
    """put_chunks stores the next rows of a package from its file, from row `first`, in one
    transaction; returns how many."""
    chunks = read_chunks(path, first)
    with _transaction(db):
        db.executemany(
            "INSERT INTO package_chunks (sha256, seq, data) VALUES (?, ?, ?)",
            [(sha256, first + i, data) for i, data in enumerate(chunks)],
        )
    return len(chunks)


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


def reclaim_pages(db: sqlite3.Connection) -> None:
    """reclaim_pages gives up to RECLAIM_PAGES free pages back to the filesystem."""
    db.execute(f"PRAGMA incremental_vacuum({RECLAIM_PAGES})").fetchall()


def select(db: sqlite3.Connection, sql: str, args: Any) -> list[sqlite3.Row]:
    """select: the rows of one query (autocommit: a transaction of its own)."""
    return db.execute(sql, args).fetchall()


def change(db: sqlite3.Connection, sql: str, args: Any) -> int:
    """change runs one statement as its own transaction; returns the rows it changed."""
    with db:  # commits, or rolls back on an error
        return db.execute(sql, args).rowcount


def load_all(
    db: sqlite3.Connection, spec_loader: SpecLoader
) -> tuple[list[JobRecord], list[NodeRecord]]:
    """load_all: see Store.load."""
    db.execute("BEGIN")  # one snapshot of every table
    try:
        jobs = {
            row["id"]: job_from(row, spec_loader(row["spec"]))
            for row in db.execute("SELECT * FROM jobs ORDER BY submit_time, id")
        }
        pods = map(pod_from, db.execute("SELECT * FROM pods ORDER BY job_id, rowid"))
        loaded = sorted_pods(jobs, pods)
        nodes = [node_from(row) for row in db.execute("SELECT * FROM nodes ORDER BY name")]
    finally:
        db.execute("COMMIT")
    return loaded, nodes


def read_queues(db: sqlite3.Connection, names: set[str] | None) -> list[QueueRecord]:
    """read_queues: the queues of these names (None: every queue), by name."""
    found = [queue_from(row) for row in db.execute("SELECT * FROM queues ORDER BY name")]
    return found if names is None else [q for q in found if q.name in names]


def read_records(
    db: sqlite3.Connection,
    job_ids: set[str],
    pod_uids: set[str],
    node_names: set[str],
    queue_names: set[str],
    spec_loader: SpecLoader,
) -> StoredRecords:
    """read_records: see Store.read_records."""
    found = StoredRecords()
    for job_id in job_ids:
        row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is not None:
            found.jobs[job_id] = job_from(row, spec_loader(row["spec"]))
    for uid in pod_uids:
        row = db.execute("SELECT * FROM pods WHERE uid = ?", (uid,)).fetchone()
        if row is not None:
            found.pods[uid] = pod_from(row)
    for name in node_names:
        row = db.execute("SELECT * FROM nodes WHERE name = ?", (name,)).fetchone()
        if row is not None:
            found.nodes[name] = node_from(row)
    found.queues = {q.name: q for q in read_queues(db, queue_names)}
    return found


def read_events(db: sqlite3.Connection, job_id: str, limit: int, before: int) -> list[EventRecord]:
    """read_events: see Store.events."""
    args: list[object] = [before or NO_EVENT_ID, limit]
    where = "id < ?"
    if job_id:
        where, args = "job_id = ? AND id < ?", [job_id, *args]
    sql = f"SELECT * FROM events WHERE {where} ORDER BY id DESC LIMIT ?"
    return [event_from(row) for row in reversed(db.execute(sql, args).fetchall())]


def read_history(db: sqlite3.Connection, query: HistoryQuery) -> list[HistoryRecord]:
    """read_history: see Store.history."""
    where, args = ["(end_time, id) > (?, ?)", "end_time < ?"], [*query.after, query.until]
    for column, value in query.filters():
        if value:
            where.append(f"{column} = ?")
            args.append(value)
    sql = f"SELECT * FROM history WHERE {' AND '.join(where)} ORDER BY end_time, id LIMIT ?"
    return [history_from(row) for row in db.execute(sql, [*args, query.limit])]
