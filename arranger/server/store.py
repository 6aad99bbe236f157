"""store keeps jobs, pods, nodes and events in SQLite (aiosqlite, WAL, synchronous=FULL).

Writes are batches of whole rows serialised at the moment of the change; concurrent batches are
group-committed in one transaction, so a burst of submits costs one fsync and a scheduling
cycle is always one transaction. A batch is durable when `write` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiosqlite

from arranger.sched import GpuShare
from arranger.server.effects import Pruning
from arranger.server.history import HistoryRecord
from arranger.server.model import EventRecord, GpuRecord, JobRecord, NodeRecord, PodRecord
from arranger.server.queues import QueueRecord
from arranger.server.schema import MIGRATIONS
from arranger.spec import JobSpec
from arranger.states import NodeState, PodState, Role, ScheduleState, Stage

Row = tuple[Any, ...]
PRUNE_BATCH = 5_000  # events or history records deleted in one transaction, at most
RECLAIM_PAGES = 4_096  # free pages given back to the filesystem at a time


class StoreError(RuntimeError):
    """StoreError: the store cannot be opened or written (the message says why)."""


@dataclass
class Batch:
    """Batch is rows to upsert and delete, serialised when the change was made."""

    jobs: list[Row] = field(default_factory=list)
    pods: list[Row] = field(default_factory=list)
    nodes: list[Row] = field(default_factory=list)
    events: list[Row] = field(default_factory=list)
    removed_jobs: list[str] = field(default_factory=list)
    queues: list[Row] = field(default_factory=list)
    removed_queues: list[str] = field(default_factory=list)
    token_uses: list[tuple[float, str]] = field(default_factory=list)  # (when, token hash)
    history: list[Row] = field(default_factory=list)
    pruned: Pruning | None = None

    def __bool__(self) -> bool:
        return bool(
            self.jobs or self.pods or self.nodes or self.events or self.removed_jobs
            or self.queues or self.removed_queues or self.token_uses or self.history
            or self.pruned
        )  # fmt: skip

    def add_history(self, record: HistoryRecord) -> None:
        r = record
        self.history.append(
            (r.job_id, r.name, r.owner, r.queue, r.priority, r.submit_time, r.start_time,
             r.end_time, r.waited_s, r.ran_s, r.stage, r.reason, r.message, r.stopped_by,
             r.leader_exit, json.dumps(r.worker_exits), json.dumps(r.nodes), r.pods, r.restarts,
             r.cpu_core_hours, r.gpu_hours, r.memory_gib_hours)
        )  # fmt: skip

    def add_queue(self, queue: QueueRecord) -> None:
        self.queues.append(
            (queue.name, queue.weight, queue.cpu_milli, queue.memory_bytes, queue.gpu_milli,
             json.dumps(list(queue.machine_groups)), json.dumps(list(queue.users)),
             queue.max_priority, int(queue.allow_non_preemptible))
        )  # fmt: skip

    def add_job(self, job: JobRecord) -> None:
        self.jobs.append(
            (
                job.id, job.name, job.spec.queue, job.spec_json, job.stage.value,
                job.schedule_state.value, job.reason, job.message, job.submit_time,
                job.start_time, job.finish_time, job.leader_restarts,
                json.dumps(job.set_restarts), int(job.terminating), int(job.deleted),
                job.infeasible_since, job.leader_address, job.waiting_since, job.owner,
                job.stopped_by, json.dumps(job.nodes_used), job.cpu_core_s, job.memory_gib_s,
                job.gpu_s,
            )
        )  # fmt: skip

    def add_pod(self, pod: PodRecord) -> None:
        self.pods.append(
            (
                pod.uid, pod.job_id, pod.name, pod.role.value, pod.worker_set, pod.index,
                pod.rank, int(pod.in_minimum), pod.state.value, pod.attempt, pod.node,
                json.dumps([[g.index, g.milli] for g in pod.gpus]), pod.exit_code, pod.reason,
                pod.pid, json.dumps(pod.ports), pod.start_time, pod.finish_time,
                pod.not_before, int(pod.stopping), pod.requeue, int(pod.done), pod.held_since,
            )
        )  # fmt: skip

    def add_node(self, node: NodeRecord) -> None:
        gpus = [[g.index, g.uuid, g.model, g.memory_bytes, g.fake] for g in node.gpus]
        self.nodes.append(
            (
                node.name, node.address, node.cpu_milli, node.memory_bytes, json.dumps(gpus),
                json.dumps(node.labels), node.state.value, int(node.cordoned),
                node.agent_version, json.dumps(node.runtimes),
            )
        )  # fmt: skip

    def add_event(self, event: EventRecord) -> None:
        self.events.append(
            (event.time, event.kind, event.job_id, event.job_name, event.pod, event.message)
        )


@dataclass
class StoredRecords:
    """StoredRecords: some records as the store holds them, by id, uid or name."""

    jobs: dict[str, JobRecord] = field(default_factory=dict)
    pods: dict[str, PodRecord] = field(default_factory=dict)
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    queues: dict[str, QueueRecord] = field(default_factory=dict)


class Store:
    """Store is the one connection to the SQLite file; use `await Store.open(path)`."""

    def __init__(self, db: aiosqlite.Connection, path: Path) -> None:
        self._db = db
        self.path = path
        self._queue: list[tuple[Batch, asyncio.Future[None]]] = []
        self._upserts: dict[str, str] = {}
        self._closed = False
        self._writer: asyncio.Task[None] | None = None
        self.cluster_id = ""  # set by open: the id every agent of this cluster remembers
        self.broken = ""  # why this store may not be written any more ("": it may)
        self.pruned_rows = 0  # events or history records the last prune deleted (the most)
        self._identity = _identity(path)  # the file opened: a removed or replaced one is noticed

    @classmethod
    async def open(cls, path: Path, create: bool = False) -> Store:
        """open opens the store at `path`, migrating it to this version; with `create` it
        makes one where there is none. Its directory is made 0700 and its files 0600: the
        store holds every job's environment and every token's hash, for the server's user
        alone."""
        try:
            _private(path, create)
        except OSError as exc:
            raise StoreError(f"cannot open store {path}: {exc}") from exc
        try:
            db = await aiosqlite.connect(path, isolation_level=None)
            await db.execute("PRAGMA journal_mode=WAL")
            await db.execute("PRAGMA synchronous=FULL")
            await db.execute("PRAGMA foreign_keys=ON")
            await db.execute("PRAGMA busy_timeout=5000")
            async with db.execute("SELECT count(*) FROM sqlite_master") as cursor:
                row = await cursor.fetchone()
            if row is not None and row[0] == 0:  # a new store: free pages can be given back
                await db.execute("PRAGMA auto_vacuum=INCREMENTAL")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open store {path}: {exc}") from exc
        store = cls(db, path)
        try:
            await store._migrate()
            for table in (
                "jobs",
                "pods",
                "nodes",
                "queues",
            ):  # rows are tuples in the schema's column order
                async with db.execute(f"PRAGMA table_info({table})") as cursor:
                    columns = [row[1] for row in await cursor.fetchall()]
                store._upserts[table] = _upsert(table, columns)
            async with db.execute("SELECT id FROM cluster") as cursor:
                row = await cursor.fetchone()
            if row is None:
                raise StoreError(f"store {path} has no cluster id: it is damaged")
            store.cluster_id = str(row[0])
        except BaseException as exc:
            await db.close()
            if isinstance(exc, sqlite3.Error):
                raise StoreError(f"cannot open store {path}: {exc}") from exc
            raise
        return store

    async def _migrate(self) -> None:
        async with self._db.execute("PRAGMA user_version") as cursor:
            row = await cursor.fetchone()
        version = int(row[0]) if row else 0
        if version > len(MIGRATIONS):
            raise StoreError(
                f"store {self.path} has schema version {version}; this arranger knows up to "
                f"{len(MIGRATIONS)}: upgrade arranger"
            )
        for number in range(version, len(MIGRATIONS)):
            script = f"BEGIN IMMEDIATE;\n{MIGRATIONS[number]}\nPRAGMA user_version = {number + 1};\nCOMMIT;"
            try:
                await self._db.executescript(script)
            except sqlite3.Error as exc:
                with contextlib.suppress(sqlite3.Error):
                    await self._db.execute("ROLLBACK")
                raise StoreError(
                    f"cannot migrate store {self.path} to version {number + 1}: {exc}"
                ) from exc

    async def close(self) -> None:
        self._closed = True
        if self._writer is not None:
            with contextlib.suppress(Exception):
                await self._writer
        await self._db.close()

    # Writing.

    async def write(self, batch: Batch) -> None:
        """write makes the batch durable, together with any batches queued at the same time."""
        if not batch:
            return
        if self._closed:
            raise StoreError(f"store {self.path} is closed")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((batch, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._drain())
        await future

    async def _drain(self) -> None:
        while self._queue:
            pending, self._queue = self._queue, []
            try:
                await self._commit([batch for batch, _ in pending])
            except Exception as exc:  # every waiter learns the transaction failed
                error = StoreError(f"cannot write store {self.path}: {exc}")
                for _, future in pending:
                    if not future.done():
                        future.set_exception(error)
                continue
            for _, future in pending:
                if not future.done():
                    future.set_result(None)

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
        db = self._db
        await db.execute("BEGIN IMMEDIATE")
        try:
            for batch in batches:
                if batch.jobs:
                    await db.executemany(self._upserts["jobs"], batch.jobs)
                if batch.pods:
                    await db.executemany(self._upserts["pods"], batch.pods)
                if batch.nodes:
                    await db.executemany(self._upserts["nodes"], batch.nodes)
                if batch.events:
                    await db.executemany(
                        "INSERT INTO events (time, kind, job_id, job_name, pod, message) "
                        "VALUES (?, ?, ?, ?, ?, ?)",
                        batch.events,
                    )
                if batch.removed_jobs:
                    ids = [(job_id,) for job_id in batch.removed_jobs]
                    await db.executemany("DELETE FROM jobs WHERE id = ?", ids)
                if batch.queues:
                    await db.executemany(self._upserts["queues"], batch.queues)
                if batch.removed_queues:
                    names = [(name,) for name in batch.removed_queues]
                    await db.executemany("DELETE FROM queues WHERE name = ?", names)
                if batch.token_uses:
                    await db.executemany(
                        "UPDATE tokens SET last_used = ? WHERE hash = ?", batch.token_uses
                    )
                if batch.pruned is not None:
                    await self._prune(batch.pruned)
                if batch.history:
                    marks = ", ".join("?" * len(batch.history[0]))
                    await db.executemany(
                        f"INSERT OR REPLACE INTO history VALUES ({marks})", batch.history
                    )
            await db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                await db.execute("ROLLBACK")
            raise

    async def _prune(self, pruned: Pruning) -> None:
        """_prune deletes what retention let go, in the transaction under way: the events of
        the pruned jobs, then (a bounded batch each) events of no job in the store older than
        `events_before` and history records that ended before `history_before`."""
        db = self._db
        self.pruned_rows = 0
        if pruned.jobs:
            await db.executemany(
                "DELETE FROM events WHERE job_id = ?", [(job_id,) for job_id in pruned.jobs]
            )
        if pruned.events_before is not None:
            cursor = await db.execute(
                "DELETE FROM events WHERE id IN (SELECT id FROM events WHERE time < ? AND "
                "(job_id = '' OR job_id NOT IN (SELECT id FROM jobs)) ORDER BY id LIMIT ?)",
                (pruned.events_before, PRUNE_BATCH),
            )
            self.pruned_rows += max(0, cursor.rowcount)
        if pruned.history_before is not None:
            cursor = await db.execute(
                "DELETE FROM history WHERE id IN (SELECT id FROM history WHERE end_time < ? "
                "ORDER BY end_time LIMIT ?)",
                (pruned.history_before, PRUNE_BATCH),
            )
            self.pruned_rows = max(self.pruned_rows, cursor.rowcount)

    async def reclaim(self) -> None:
        """reclaim gives free pages back to the filesystem, a bounded number at a time, in a
        store made with incremental auto-vacuum (one made before keeps and reuses them)."""
        async with self._db.execute(f"PRAGMA incremental_vacuum({RECLAIM_PAGES})") as cursor:
            await cursor.fetchall()

    # Reading.

    async def load(
        self, spec_loader: Callable[[str], JobSpec]
    ) -> tuple[list[JobRecord], list[NodeRecord]]:
        """load reads every job (with its pods) and node, to rebuild the server's state. A
        store that cannot be read (damaged) is a StoreError."""
        try:
            return await self._load(spec_loader)
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                f"cannot read store {self.path}: {exc} (restore it from a backup: README, "
                '"Backups")'
            ) from exc

    async def _load(
        self, spec_loader: Callable[[str], JobSpec]
    ) -> tuple[list[JobRecord], list[NodeRecord]]:
        jobs: dict[str, JobRecord] = {}
        async with self._db.execute("SELECT * FROM jobs ORDER BY submit_time, id") as cursor:
            async for row in cursor:
                jobs[row[0]] = _job(row, spec_loader(row[3]))
        async with self._db.execute("SELECT * FROM pods ORDER BY job_id, rowid") as cursor:
            async for row in cursor:
                pod = _pod(row)
                job = jobs.get(pod.job_id)
                if job is not None:
                    job.pods[pod.name] = pod
        for job in jobs.values():  # the leader first, then workers by rank
            job.pods = dict(sorted(job.pods.items(), key=lambda item: item[1].rank))
        async with self._db.execute("SELECT * FROM nodes ORDER BY name") as cursor:
            nodes = [_node(row) async for row in cursor]
        return list(jobs.values()), nodes

    async def token_owner(self, digest: str) -> tuple[str, str] | None:
        """token_owner: the user and role of the token with this SHA-256, None if none was
        issued (or it was revoked)."""
        sql = "SELECT user, role FROM tokens WHERE hash = ?"
        async with self._db.execute(sql, (digest,)) as cursor:
            row = await cursor.fetchone()
        return (str(row[0]), str(row[1])) if row else None

    async def tokens_revoked(
        self, digests: Iterable[str], used: float, note: Iterable[str] = ()
    ) -> set[str]:
        """tokens_revoked: which of these token hashes are no longer issued; those of `note`
        that still are are noted as used at `used`."""
        wanted = sorted(set(digests))
        if not wanted:
            return set()
        marks = ", ".join("?" * len(wanted))
        async with self._db.execute(
            f"SELECT hash FROM tokens WHERE hash IN ({marks})", wanted
        ) as cursor:
            known = {str(row[0]) for row in await cursor.fetchall()}
        noted = sorted(known.intersection(note))
        if noted:
            await self.write(Batch(token_uses=[(used, digest) for digest in noted]))
        return set(wanted) - known

    async def read_records(
        self, job_ids: Iterable[str], pod_uids: Iterable[str], node_names: Iterable[str],
        queue_names: Iterable[str], spec_loader: Callable[[str], JobSpec],
    ) -> StoredRecords:  # fmt: skip
        """read_records reads these records as the store holds them (those it does not hold
        are absent), so that memory can be put back after a write that failed."""
        found = StoredRecords()
        db = self._db
        for job_id in set(job_ids):
            async with db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)) as cursor:
                row = await cursor.fetchone()
            if row is not None:
                found.jobs[job_id] = _job(row, spec_loader(row[3]))
        for uid in set(pod_uids):
            async with db.execute("SELECT * FROM pods WHERE uid = ?", (uid,)) as cursor:
                row = await cursor.fetchone()
            if row is not None:
                found.pods[uid] = _pod(row)
        for name in set(node_names):
            async with db.execute("SELECT * FROM nodes WHERE name = ?", (name,)) as cursor:
                row = await cursor.fetchone()
            if row is not None:
                found.nodes[name] = _node(row)
        wanted = set(queue_names)
        found.queues = {q.name: q for q in await self.load_queues() if q.name in wanted}
        return found

    async def load_queues(self) -> list[QueueRecord]:
        try:
            async with self._db.execute("SELECT * FROM queues ORDER BY name") as cursor:
                rows = await cursor.fetchall()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot read store {self.path}: {exc}") from exc
        return [
            QueueRecord(r[0], r[1], r[2], r[3], r[4], tuple(json.loads(r[5])),
                        tuple(json.loads(r[6])), r[7], bool(r[8]))
            for r in rows
        ]  # fmt: skip

    async def events(self, job_id: str = "", limit: int = 1000) -> list[EventRecord]:
        """events returns the newest `limit` events (of one job, when given), oldest first."""
        where, args = ("WHERE job_id = ?", (job_id, limit)) if job_id else ("", (limit,))
        sql = (
            "SELECT time, kind, message, job_id, job_name, pod FROM events "
            f"{where} ORDER BY id DESC LIMIT ?"
        )
        async with self._db.execute(sql, args) as cursor:
            rows = await cursor.fetchall()
        return [EventRecord(*row) for row in reversed(list(rows))]

    async def history(self, query: HistoryQuery) -> list[HistoryRecord]:
        """history: up to `query.limit` records that match, after `query.after` (an end time
        and id), oldest end first. It walks an index on (end time, id), or on (owner, end
        time, id) for one user's: a page costs what it returns plus the records the queue
        and name filters skip."""
        where, args = ["(end_time, id) > (?, ?)", "end_time < ?"], [*query.after, query.until]
        for column, value in (("owner", query.user), ("queue", query.queue), ("name", query.name)):
            if value:
                where.append(f"{column} = ?")
                args.append(value)
        sql = f"SELECT * FROM history WHERE {' AND '.join(where)} ORDER BY end_time, id LIMIT ?"
        async with self._db.execute(sql, [*args, query.limit]) as cursor:
            rows = await cursor.fetchall()
        return [_history(row) for row in rows]

    async def finished_without_history(self, since: float) -> list[str]:
        """finished_without_history: the ids of finished jobs that ended at `since` or later
        and have no history record (they finished before records were kept)."""
        sql = (
            "SELECT id FROM jobs WHERE stage IN ('Succeeded', 'Failed') AND finish_time >= ? "
            "AND NOT EXISTS (SELECT 1 FROM history WHERE history.id = jobs.id)"
        )
        async with self._db.execute(sql, (since,)) as cursor:
            return [str(row[0]) for row in await cursor.fetchall()]


@dataclass(frozen=True)
class HistoryQuery:
    """HistoryQuery: records of jobs that ended in [after's end time, until), after `after`
    (end time, id) in that order; empty filters match every record."""

    after: tuple[float, str] = (-math.inf, "")
    until: float = math.inf
    user: str = ""
    queue: str = ""
    name: str = ""
    limit: int = 500


def _history(row: Sequence[Any]) -> HistoryRecord:
    return HistoryRecord(
        job_id=row[0], name=row[1], owner=row[2], queue=row[3], priority=row[4],
        submit_time=row[5], start_time=row[6], end_time=row[7], stage=row[10], reason=row[11],
        message=row[12], stopped_by=row[13], leader_exit=row[14],
        worker_exits=tuple((code, count) for code, count in json.loads(row[15])),
        nodes=tuple(json.loads(row[16])), pods=row[17], restarts=row[18],
        cpu_core_hours=row[19], gpu_hours=row[20], memory_gib_hours=row[21],
    )  # fmt: skip


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


def _upsert(table: str, columns: list[str]) -> str:
    """_upsert updates a row in place. Not INSERT OR REPLACE: a replace deletes the row first,
    and deleting a job row would cascade to its pods."""
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns[1:])
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
        f"ON CONFLICT({columns[0]}) DO UPDATE SET {updates}"
    )


def _job(row: Sequence[Any], spec: JobSpec) -> JobRecord:
    return JobRecord(
        id=row[0], spec=spec, spec_json=row[3], stage=Stage(row[4]),
        schedule_state=ScheduleState(row[5]), reason=row[6], message=row[7],
        submit_time=row[8], start_time=row[9], finish_time=row[10], leader_restarts=row[11],
        set_restarts=json.loads(row[12]), terminating=bool(row[13]), deleted=bool(row[14]),
        infeasible_since=row[15], leader_address=row[16], waiting_since=row[17], owner=row[18],
        stopped_by=row[19], nodes_used=json.loads(row[20]), cpu_core_s=row[21],
        memory_gib_s=row[22], gpu_s=row[23],
    )  # fmt: skip


def _pod(row: Sequence[Any]) -> PodRecord:
    return PodRecord(
        uid=row[0], job_id=row[1], name=row[2], role=Role(row[3]), worker_set=row[4],
        index=row[5], rank=row[6], in_minimum=bool(row[7]), state=PodState(row[8]),
        attempt=row[9], node=row[10], gpus=tuple(GpuShare(i, m) for i, m in json.loads(row[11])),
        exit_code=row[12], reason=row[13], pid=row[14], ports=json.loads(row[15]),
        start_time=row[16], finish_time=row[17], not_before=row[18], stopping=bool(row[19]),
        requeue=int(row[20]), done=bool(row[21]), held_since=row[22],
    )  # fmt: skip


def _node(row: Sequence[Any]) -> NodeRecord:
    gpus = [GpuRecord(*g) for g in json.loads(row[4])]
    return NodeRecord(
        name=row[0], address=row[1], cpu_milli=row[2], memory_bytes=row[3], gpus=gpus,
        labels=json.loads(row[5]), state=NodeState(row[6]), cordoned=bool(row[7]),
        agent_version=row[8], runtimes=json.loads(row[9]),
    )  # fmt: skip


def batch_of(
    jobs: Iterable[JobRecord], pods: Iterable[PodRecord], nodes: Iterable[NodeRecord],
    events: Iterable[EventRecord], removed: Iterable[str],
    queues: Iterable[QueueRecord] = (), removed_queues: Iterable[str] = (),
    history: Iterable[HistoryRecord] = (),
) -> Batch:  # fmt: skip
    """batch_of serialises records now, so later changes to them do not leak into this write."""
    batch = Batch(removed_jobs=list(removed), removed_queues=list(removed_queues))
    for record in history:
        batch.add_history(record)
    for queue in queues:
        batch.add_queue(queue)
    for job in jobs:
        batch.add_job(job)
    for pod in pods:
        batch.add_pod(pod)
    for node in nodes:
        batch.add_node(node)
    for event in events:
        batch.add_event(event)
    return batch
