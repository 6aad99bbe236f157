"""base: the store's interface. The server, its commands and its tests speak to a store only
through `Store`; a backend (SQLite, PostgreSQL) implements it and holds all of its SQL.

Writes are batches of rows serialised at the moment of the change (`batch_of`). Each `write`
is one transaction of its own, taken one at a time in the order they were asked for, and its
batch is durable when it returns. The store keeps no queue of its own: merging the changes
that arrive meanwhile into one batch (group commit) is server.writes' (`GroupCommit`), which
sees them as the controller made them.
"""

from __future__ import annotations

import abc
import asyncio
import math
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arranger.server.effects import Pruning
from arranger.server.history import HistoryRecord
from arranger.server.model import (
    EventRecord,
    ExperimentRecord,
    JobRecord,
    NodeRecord,
    PodRecord,
)
from arranger.server.queues import QueueRecord
from arranger.server.reports import JobReports, reports_of
from arranger.server.store.experiment_rows import experiment_from
from arranger.server.store.history_rows import history_row
from arranger.server.store.rows import (
    Row,
    event_row,
    job_row,
    node_row,
    pod_row,
    queue_row,
)
from arranger.spec import JobSpec

PRUNE_BATCH = 5_000  # events or history records deleted in one transaction, at most
PACKAGE_CHUNK_BYTES = 2**20  # a package row's bytes, at most
PACKAGE_CHUNKS_PER_WRITE = 16  # package rows written in one transaction, at most
SpecLoader = Callable[[str], JobSpec]


class StoreError(RuntimeError):
    """StoreError: the store cannot be opened, read or written (the message says why)."""


@dataclass
class Batch:
    """Batch: rows to upsert and delete, serialised when the change was made (see rows)."""

    jobs: list[Row] = field(default_factory=list)
    pods: list[Row] = field(default_factory=list)
    nodes: list[Row] = field(default_factory=list)
    events: list[Row] = field(default_factory=list)
    removed_jobs: list[str] = field(default_factory=list)
    queues: list[Row] = field(default_factory=list)
    removed_queues: list[str] = field(default_factory=list)
    token_uses: list[tuple[float, str]] = field(default_factory=list)  # (when, token hash)
    history: list[Row] = field(default_factory=list)
    experiments: list[Row] = field(default_factory=list)
    # Reported values as they changed: points (job, key, step, value), points gone (job, key,
    # step), notes (job, key, text).
    report_points: list[tuple[str, str, int, float]] = field(default_factory=list)
    report_gone: list[tuple[str, str, int]] = field(default_factory=list)
    report_notes: list[tuple[str, str, str]] = field(default_factory=list)
    left_experiments: list[str] = field(default_factory=list)  # of removed jobs: gone if empty
    pruned: Pruning | None = None

    def report_rows(self) -> tuple[list[Any], ...]:
        """report_rows: the reported values' rows, in the order they are written: points gone,
        points, notes (a step reported again after a rewind is written last)."""
        return self.report_gone, self.report_points, self.report_notes

    def __bool__(self) -> bool:
        return bool(
            self.jobs
            or self.pods
            or self.nodes
            or self.events
            or self.removed_jobs
            or self.queues
            or self.removed_queues
            or self.token_uses
            or self.history
            or self.experiments
            or self.report_points
            or self.report_gone
            or self.report_notes
            or self.pruned
        )


def batch_of(
    jobs: Iterable[JobRecord],
    pods: Iterable[PodRecord],
    nodes: Iterable[NodeRecord],
    events: Iterable[EventRecord],
    removed: Iterable[str],
    queues: Iterable[QueueRecord] = (),
    removed_queues: Iterable[str] = (),
    history: Iterable[HistoryRecord] = (),
) -> Batch:
    """batch_of serialises records now, so later changes to them do not leak into this write.
    Rows of jobs that hold no name (ended or deleted) go first: a name that an ended job passed
    to a new one, both written here, never meets itself in the unfinished jobs' name index."""
    return Batch(
        jobs=[job_row(job) for job in sorted(jobs, key=_holds_name)],
        pods=[pod_row(pod) for pod in pods],
        nodes=[node_row(node) for node in nodes],
        events=[event_row(event) for event in events],
        removed_jobs=list(removed),
        queues=[queue_row(queue) for queue in queues],
        removed_queues=list(removed_queues),
        history=[history_row(record) for record in history],
    )


def _holds_name(job: JobRecord) -> bool:
    """_holds_name: whether the job's row is in the name index (unfinished and not deleted)."""
    return not (job.deleted or job.stage.finished)


@dataclass
class StoredRecords:
    """StoredRecords: some records as the store holds them, by id, uid or name."""

    jobs: dict[str, JobRecord] = field(default_factory=dict)
    pods: dict[str, PodRecord] = field(default_factory=dict)
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    queues: dict[str, QueueRecord] = field(default_factory=dict)


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
    experiment: str = ""  # an experiment's id

    def filters(self) -> tuple[tuple[str, str], ...]:
        """filters: each column filtered on and the value it must have (empty: any)."""
        return (
            ("owner", self.user),
            ("queue", self.queue),
            ("name", self.name),
            ("experiment", self.experiment),
        )


@dataclass(frozen=True)
class TokenRow:
    """TokenRow: an issued token as `arranger token list` shows it (never the token itself)."""

    name: str
    user: str
    role: str
    created: float
    last_used: float | None


@dataclass(frozen=True)
class Lease:
    """Lease: which server is active on a shared store. `holder` is where clients and agents
    reach it; `epoch` grows with every server that takes the lease; `remaining_s` is how long
    it holds by the database's clock (at most 0: it lapsed, and any server may take it)."""

    holder: str
    epoch: int
    remaining_s: float


class Unreachable(StoreError):
    """Unreachable: the store's database server cannot be reached now (refused, timed out, or
    gone mid-connection): it may be back later, unlike a store that is wrong."""


class Fenced(StoreError):
    """Fenced: another server took the lease; this one may write nothing more."""


class Store(abc.ABC):
    """Store: the server's records, durable. Open one with `open_store(url)`.

    A `shared` store may be opened by several servers at once: they elect the active one with
    its lease, and once a store has taken the lease (`epoch` set) every write checks that the
    lease is still of that epoch, so a server that lost it cannot write. A store that is not
    shared has one server and no lease: taking it always succeeds, at epoch 0.
    """

    shared = False

    def __init__(self, url: str) -> None:
        self.url = url  # where it is, as logs and messages say it (never a password)
        self.cluster_id = ""  # the id every agent of this cluster remembers
        self.job_key = ""  # the key job tokens are derived with (hex; see job_tokens)
        self.created = False  # this open made the store (it had no schema)
        self.broken = ""  # why this store may not be written any more ("": it may)
        self.pruned_rows = 0  # events or history records the last prune deleted (the most)
        self.epoch: int | None = None  # the lease this store's writes are fenced by, once taken
        self._write_lock = asyncio.Lock()  # one write transaction at a time, in order
        self._closed = False

    # Writing.

    async def write(self, batch: Batch) -> None:
        """write makes the batch durable in one transaction, after the writes asked for before
        it have ended. A failed write is a StoreError and writes nothing of its batch."""
        if not batch:
            return
        if self._closed:
            raise StoreError(f"store {self.url} is closed")
        async with self._write_lock:
            try:
                await self._commit(batch)
            except StoreError:
                raise
            except Exception as exc:
                raise StoreError(f"cannot write store {self.url}: {exc}") from exc

    @abc.abstractmethod
    async def _commit(self, batch: Batch) -> None:
        """_commit writes the batch in one transaction: all of it or none."""

    async def close(self) -> None:
        """close waits for the writes asked for before it, then lets the store go."""
        self._closed = True
        async with self._write_lock:
            await self._close()

    @abc.abstractmethod
    async def _close(self) -> None: ...

    @abc.abstractmethod
    async def reclaim(self) -> None:
        """reclaim gives space freed by pruning back, a bounded amount at a time, where the
        backend does not do it by itself."""

    async def backup(self, out: Path) -> str:
        """backup copies the live store to `out`, consistently, and says what it copied."""
        raise StoreError(f"store {self.url} cannot be copied by arranger: use its own tools")

    # The lease (a shared store's; see Lease).

    async def take_lease(self, holder: str, ttl_s: float) -> Lease:
        """take_lease takes the lease for `holder` for `ttl_s` if it lapsed; returns the lease
        as it now is (this server's if its holder and a new epoch say so; `epoch` is then set
        and fences every write)."""
        self.epoch = 0
        return Lease(holder, 0, math.inf)

    def renew_lease_now(self, ttl_s: float) -> Lease | None:
        """renew_lease_now extends this store's lease by `ttl_s` from now, by the database's
        clock; None if it is no longer of this store's epoch (another server took it). It
        blocks: it runs in a thread of its own (see leadership), so that a busy event loop
        never delays it, on a connection of its own."""
        return Lease("", 0, math.inf)

    async def renew_lease(self, ttl_s: float) -> Lease | None:
        """renew_lease: renew_lease_now, from the event loop."""
        return await asyncio.to_thread(self.renew_lease_now, ttl_s)

    async def release_lease(self) -> None:
        """release_lease lets the lease lapse now, so that a standby takes over at once."""
        return None  # a store that is not shared has no standby

    async def lease(self) -> Lease | None:
        """lease: the lease as the store holds it (None for a store that has none)."""
        return None

    # Reading.

    @abc.abstractmethod
    async def load(self, spec_loader: SpecLoader) -> tuple[list[JobRecord], list[NodeRecord]]:
        """load reads every job (its pods the leader first, then workers by rank) and every
        node, to rebuild the server's state. A store that cannot be read is a StoreError."""

    @abc.abstractmethod
    async def load_queues(self) -> list[QueueRecord]:
        """load_queues: every queue, by name."""

    async def load_experiments(self, spec_loader: SpecLoader) -> list[ExperimentRecord]:
        """load_experiments: every experiment, oldest first, without members (its jobs name
        it: see ExperimentRecord)."""
        rows = await self._rows("SELECT * FROM experiments ORDER BY submit_time, id")
        return [experiment_from(row, spec_loader(row["spec"])) for row in rows]

    async def load_reports(self) -> dict[str, JobReports]:
        """load_reports: every job's reported values and notes, by job id (see reports)."""
        points = await self._rows("SELECT * FROM report_points ORDER BY job_id, key, step")
        notes = await self._rows("SELECT * FROM report_notes")
        return reports_of(points, notes)

    @abc.abstractmethod
    async def _rows(self, sql: str) -> list[Any]:
        """_rows: the rows of one query that takes no argument."""

    @abc.abstractmethod
    async def read_records(
        self,
        job_ids: Iterable[str],
        pod_uids: Iterable[str],
        node_names: Iterable[str],
        queue_names: Iterable[str],
        spec_loader: SpecLoader,
    ) -> StoredRecords:
        """read_records reads these records as the store holds them (those it does not hold
        are absent), so that memory can be put back after a write that failed."""

    @abc.abstractmethod
    async def events(
        self, job_id: str = "", limit: int = 1000, before: int = 0
    ) -> list[EventRecord]:
        """events: the newest `limit` events (of one job, when given) older than the event
        whose seq is `before` (0: the newest of all), oldest first, from an index on (job,
        id) or the ids: a page costs what it returns."""

    @abc.abstractmethod
    async def history(self, query: HistoryQuery) -> list[HistoryRecord]:
        """history: up to `query.limit` records that match, after `query.after` (an end time
        and id), oldest end first, from an index on (end time, id) or (owner, end time, id):
        a page costs what it returns plus the records the queue and name filters skip."""

    @abc.abstractmethod
    async def finished_without_history(self, since: float) -> list[str]:
        """finished_without_history: the ids of finished jobs that ended at `since` or later
        and have no history record (they finished before records were kept)."""

    # Tokens: only their SHA-256 is kept.

    @abc.abstractmethod
    async def token_owner(self, digest: str) -> tuple[str, str] | None:
        """token_owner: the user and role of the token with this hash, None if none was
        issued (or it was revoked)."""

    @abc.abstractmethod
    async def known_tokens(self, digests: list[str]) -> set[str]:
        """known_tokens: which of these token hashes are issued."""

    async def tokens_revoked(
        self, digests: Iterable[str], used: float, note: Iterable[str] = ()
    ) -> set[str]:
        """tokens_revoked: which of these token hashes are no longer issued; those of `note`
        that still are are noted as used at `used`."""
        wanted = sorted(set(digests))
        if not wanted:
            return set()
        known = await self.known_tokens(wanted)
        noted = sorted(known.intersection(note))
        if noted:
            await self.write(Batch(token_uses=[(used, digest) for digest in noted]))
        return set(wanted) - known

    @abc.abstractmethod
    async def add_token(self, name: str, user: str, role: str, digest: str, now: float) -> None:
        """add_token records an issued token (its hash) for `user` with `role`; a name already
        taken is a StoreError."""

    @abc.abstractmethod
    async def list_tokens(self) -> list[TokenRow]:
        """list_tokens: the issued tokens, by name."""

    @abc.abstractmethod
    async def delete_token(self, name: str) -> bool:
        """delete_token revokes a token by name; False if there is none of that name."""

    # Packages: jobs' working directories, by the SHA-256 of their archive (see
    # arranger.server.packages). They are content: any server may write one, fenced or not.
    # Each belongs to the users who uploaded it (its owners); `owner` None asks for any
    # package (an admin, or an agent fetching one a job names).

    @abc.abstractmethod
    async def package_size(self, sha256: str, owner: str | None = None) -> int | None:
        """package_size: the size of the complete package of this hash (None: none is held,
        or `owner` does not own it)."""

    @abc.abstractmethod
    async def touch_package(self, sha256: str, now: float, owner: str | None = None) -> bool:
        """touch_package notes that the complete package of this hash was asked for `now`
        (pruning keeps it a while longer); False, noting nothing, if none is held or `owner`
        does not own it."""

    @abc.abstractmethod
    async def put_package(self, sha256: str, size: int, now: float, path: Path, owner: str) -> bool:
        """put_package stores the archive in the file at `path` (whose hash and size the
        caller checked) as the package `sha256`, PACKAGE_CHUNK_BYTES a row and at most
        PACKAGE_CHUNKS_PER_WRITE rows a transaction, then marks it complete and `owner`'s. If
        a complete one is held already it writes no data, notes the upload `now` and makes it
        `owner`'s too. True if it was not `owner`'s before."""

    @abc.abstractmethod
    async def package_bytes(self, owner: str) -> int:
        """package_bytes: the size of every complete package `owner` owns, added up (one
        that others own too counts in full)."""

    @abc.abstractmethod
    def package_chunks(self, sha256: str, size: int) -> AsyncIterator[bytes]:
        """package_chunks: the package's bytes, a row at a time, in order."""
