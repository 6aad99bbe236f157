"""sqlite_file: the SQLite store's file: made private, opened in WAL mode, brought to this
version's schema (copied beside itself first when older), backed up, and known by its identity
(device, inode) so that a file removed or replaced under the server is noticed.

Every function but `identity` runs in the store's thread, on its one connection.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import structlog

from arranger.server.store.base import StoreError
from arranger.server.store.sql import NEW_CLUSTER, version_problem
from arranger.server.store.sqlite_schema import MIGRATIONS

log = structlog.get_logger("arranger.server")


def connect(path: Path, create: bool, migrate: bool) -> tuple[sqlite3.Connection, bool]:
    """connect opens the file and brings it to this version; True if it had no schema."""
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
        said = backup_file(db, path, path.with_name(f"{path.name}.v{version}-{stamp}.bak"))
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


def cluster_ids(db: sqlite3.Connection, path: Path) -> tuple[str, str]:
    """cluster_ids: the store's cluster id and the key job tokens are derived with."""
    row = db.execute("SELECT id, job_key FROM cluster").fetchone()
    if row is None:
        raise StoreError(f"store {path} has no cluster id: it is damaged")
    return str(row["id"]), str(row["job_key"])


def backup_file(db: sqlite3.Connection, path: Path, out: Path) -> str:
    """backup_file copies the store with SQLite's online backup: a consistent copy even while the
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


def identity(path: Path) -> tuple[int, int] | None:
    """identity: the file at `path` (device, inode), None if there is none."""
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
