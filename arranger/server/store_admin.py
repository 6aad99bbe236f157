"""store_admin: what commands on the head node do to the server's store from another process.

`arranger token create|list|delete` and `arranger-server --backup` open the store file
themselves, while the server may have it open: SQLite's WAL lets a second writer in for a short
transaction. Whoever may write the server's dataDir may do this (the store is 0700/0600).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from arranger.server.schema import MIGRATIONS
from arranger.server.store import StoreError


@dataclass(frozen=True)
class TokenRow:
    """TokenRow: an issued token as `arranger token list` shows it (never the token itself)."""

    name: str
    user: str
    role: str
    created: float
    last_used: float | None


def add_token(path: Path, name: str, user: str, role: str, digest: str, now: float) -> None:
    """add_token records an issued token (its hash) for `user` with `role` in the store at
    `path`, which the server may have open: SQLite's WAL lets a second writer in. A name
    already taken is a StoreError."""
    try:
        with _admin(path) as db:
            db.execute(
                "INSERT INTO tokens (name, hash, created, user, role) VALUES (?, ?, ?, ?, ?)",
                (name, digest, now, user, role),
            )
    except sqlite3.IntegrityError as exc:
        raise StoreError(f"a token named {name!r} exists") from exc


def list_tokens(path: Path) -> list[TokenRow]:
    """list_tokens: the issued tokens, by name."""
    with _admin(path) as db:
        rows = db.execute(
            "SELECT name, user, role, created, last_used FROM tokens ORDER BY name"
        ).fetchall()
    return [TokenRow(str(n), str(u), str(r), float(c), used) for n, u, r, c, used in rows]


def delete_token(path: Path, name: str) -> bool:
    """delete_token revokes a token by name; False if there is none of that name."""
    with _admin(path) as db:
        return db.execute("DELETE FROM tokens WHERE name = ?", (name,)).rowcount > 0


def backup_store(path: Path, out: Path) -> str:
    """backup_store copies the store at `path` to `out` with SQLite's online backup: a
    consistent copy even while the server writes, readable by its owner only. To restore, stop
    the server and put the copy in place of arranger.db (removing arranger.db-wal and -shm)."""
    if out.exists():
        raise StoreError(f"{out} exists: the backup never overwrites a file")
    out.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    try:
        with _admin(path) as source, contextlib.closing(sqlite3.connect(out)) as copy:
            source.backup(copy)
            (check,) = copy.execute("PRAGMA quick_check").fetchone()
            if check != "ok":
                raise StoreError(f"the copy of {path} does not check out: {check}")
            (cluster,) = copy.execute("SELECT id FROM cluster").fetchone()
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    return f"store {path} (cluster {cluster}) copied to {out}"


@contextlib.contextmanager
def _admin(path: Path) -> Iterator[sqlite3.Connection]:
    """_admin: a short transaction on the store at `path` from another process (the server
    may have it open). The store must exist and be of this version."""
    if not path.is_file():
        raise StoreError(f"no store at {path}: start arranger-server once first")
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=10)) as db, db:
            (version,) = db.execute("PRAGMA user_version").fetchone()
            if version < len(MIGRATIONS):
                raise StoreError(
                    f"the store at {path} is older than this arranger: start the server first"
                )
            yield db
    except sqlite3.IntegrityError:
        raise
    except sqlite3.Error as exc:
        raise StoreError(f"cannot use the store at {path}: {exc}") from exc
