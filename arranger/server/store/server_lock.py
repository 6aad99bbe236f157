"""server_lock: one arranger-server per SQLite store directory.

A server holds an exclusive flock of `server.lock` beside its store for as long as it runs;
another server there is refused, naming the holder. Commands beside the server (a backup, a
token) open the store without it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from arranger.server.store.base import StoreError

LOCK_FILE = "server.lock"


def hold_directory(path: Path, create: bool) -> int | None:
    """hold_directory takes the lock that makes one server per store directory: an exclusive flock of
    `server.lock` beside the store, kept open while the server runs (the kernel drops it when
    the process ends, however it ends). The file says the holder's pid. None, holding
    nothing, where there is no directory and `create` does not make one (_connect then says
    there is no store)."""
    directory = path.parent
    if create:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    elif not directory.is_dir():
        return None
    lock = directory / LOCK_FILE
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise StoreError(f"cannot open {lock}: {exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise StoreError(
            f"another arranger-server (pid {holder}) serves the store {path}: one server per "
            "SQLite store (stop that one first; a standby server needs PostgreSQL)"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
