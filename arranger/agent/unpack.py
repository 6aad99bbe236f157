"""unpack extracts a job's package into a pod's working directory, and nothing outside it.

It runs as the pod's own account: the agent hands this file's source to `python -I -S -c`
(so it imports nothing but the standard library), the archive on stdin, the directory to
fill as the current directory, the cap as the only argument. Refused, naming the entry: a
path that is absolute or has a `..` component, or that passes through a symbolic link of the
archive; a symbolic link whose target is absolute or leads out of the tree; a hard link to
anything but a regular file earlier in the archive; a device, fifo or any other special
entry; more than MAX_ENTRIES entries or more than the cap of bytes in all. A refusal exits
REFUSED with one line on stderr; what was extracted is left for the agent to remove.
Modes keep the owner's bits and the read/execute bits of others (no setuid, no group/other
write); owners are never set; tarfile's `data` filter runs too where the Python has it.
"""

from __future__ import annotations

import posixpath
import sys
import tarfile
from typing import IO

REFUSED = 3
MAX_ENTRIES = 200_000


class Refused(Exception):
    """Refused: an entry the archive may not hold, said in one line."""


class Checker:
    """Checker: what the entries seen so far allow of the next one (see the module)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.total = 0
        self.entries = 0
        self.files: set[str] = set()
        self.links: set[str] = set()

    def check(self, member: tarfile.TarInfo) -> str:
        """check: the entry's normalised path; raises Refused when it may not be extracted."""
        name = member.name
        self.entries += 1
        if self.entries > MAX_ENTRIES:
            raise Refused(f"the package has more than {MAX_ENTRIES} entries")
        if name.startswith("/") or not name:
            raise Refused(f"{name!r}: an absolute path")
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise Refused(f"{name!r}: a path with '..'")
        path = "/".join(parts) or "."
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in self.links:
                raise Refused(f"{name!r}: a path through the symbolic link {'/'.join(parts[:i])!r}")
        if member.issym():
            target = member.linkname
            if target.startswith("/"):
                raise Refused(f"{name!r}: a symbolic link to the absolute path {target!r}")
            self._check_target(name, posixpath.join(posixpath.dirname(path), target), target)
            self.links.add(path)
        elif member.islnk():
            target = posixpath.normpath(member.linkname)
            if target not in self.files:
                raise Refused(f"{name!r}: a hard link to {member.linkname!r}, not a file before it")
        elif member.isreg():
            self.total += member.size
            if self.total > self.max_bytes:
                raise Refused(f"the package unpacks to more than {self.max_bytes} bytes (the cap)")
            self.files.add(path)
        elif not member.isdir():
            raise Refused(f"{name!r}: a device, fifo or other special file")
        if not member.issym():
            self.links.discard(path)
        return path

    def _check_target(self, name: str, joined: str, target: str) -> None:
        """_check_target: a symbolic link's target, from the top, must stay in the tree,
        and may not go up ('..') out of another symbolic link (whose own target decides
        where that leads)."""
        stack: list[str] = []
        for part in joined.split("/"):
            if part in ("", "."):
                continue
            if part != "..":
                stack.append(part)
                continue
            if not stack:
                raise Refused(f"{name!r}: a symbolic link out of the tree (to {target!r})")
            if "/".join(stack) in self.links:
                raise Refused(f"{name!r}: a symbolic link that climbs out of another one")
            stack.pop()


def unpack(archive: IO[bytes], dest: str, max_bytes: int) -> int:
    """unpack extracts the tar (gzipped or not) read from `archive` into `dest`, entry by entry as they
    stream; returns the bytes of its files. Raises Refused (see the module)."""
    checker = Checker(max_bytes)
    try:
        with tarfile.open(fileobj=archive, mode="r|*") as tar:
            for member in tar:
                checker.check(member)
                member.mode &= 0o755  # no setuid or setgid, no group/other write
                member.uid = member.gid = -1
                member.uname = member.gname = ""
                if hasattr(tarfile, "data_filter"):  # Pythons from 3.11.4 and 3.12
                    tar.extract(member, dest, filter="data")
                else:
                    tar.extract(member, dest)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise Refused(f"cannot unpack: {exc}") from exc
    return checker.total


def main() -> None:
    try:
        unpack(sys.stdin.buffer, ".", int(sys.argv[1]))
    except Refused as exc:
        sys.stderr.write(f"{exc}\n")
        sys.exit(REFUSED)


if __name__ == "__main__":
    main()
