"""datadir says who may read what in the agent's data directory.

Under the data directory, `logs/<job>/<pod>/<attempt>.log` and `scratch/<job>/<pod>/` are a
pod's: they belong to the account it runs as, readable by it alone (PRIVATE_FILE, PRIVATE).
The directories that lead to them are PASSABLE: others may pass through but not list them, so
one user learns neither the names of another's jobs nor their files. `runs/` holds the agent's
records (run records, exit codes, podman's working directories) and is the agent's alone.
`mps/<hash of the run>/` is the MPS daemon of a pod held to a GPU share (see mps): the agent's,
but for its `pipe` and `log`, which are the pod's account's.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PASSABLE, PRIVATE, PRIVATE_FILE = 0o711, 0o700, 0o600


def make_dirs(
    top: Path,
    below: Path,
    mode: int,
    last_mode: int | None = None,
    last_owner: tuple[int, int] | None = None,
) -> None:
    """make_dirs makes each directory from `top` down `below` (top itself is made as it
    comes, if missing) with `mode`, the last one with `last_mode` and owned by `last_owner`.
    Modes are set on directories that exist too, so a data directory of an older agent is
    tightened; never through a symlink."""
    top.mkdir(parents=True, exist_ok=True)
    path = top
    parts = below.parts
    for i, part in enumerate(parts):
        path = path / part
        last = i == len(parts) - 1
        wanted = last_mode if last and last_mode is not None else mode
        make_dir(path, wanted, last_owner if last else None)


def make_dir(path: Path, mode: int, owner: tuple[int, int] | None = None) -> None:
    """make_dir makes one directory (its parent must exist) with `mode`, owned by `owner`;
    the mode is set on a directory that exists too; never through a symlink."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, mode)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if owner is not None:
            os.fchown(fd, *owner)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
