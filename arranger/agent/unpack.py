"""unpack extracts a job's package into a pod's working directory, and nothing outside it.

It runs as the pod's own account: the agent hands this file's source to `python -I -S -c`
(so it imports nothing but the standard library), the archive on stdin, the directory to
fill as the current directory, the cap as the only argument. Refused, naming the entry: a
path that is absolute or has a `..` component, or that passes through a symbolic link of the
archive; a symbolic link whose target is absolute or leads out of the tree (through the
archive's links before it), or made where an earlier link's target went up from; an entry in
place of a symbolic link of the archive; a hard link to
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
MAX_HOPS = 40  # links followed in a row, as Linux does


class Refused(Exception):
    """Refused: an entry the archive may not hold, said in one line."""


class Checker:
    """Checker: what the entries seen so far allow of the next one (see the module)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.total = 0
        self.entries = 0
        self.files: set[str] = set()
        self.links: dict[str, list[str]] = {}  # a symbolic link -> where it leads, from the top
        self.climbed: set[str] = set()  # paths a link's target went up ('..') out of

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
            if path in self.climbed:
                raise Refused(f"{name!r}: a symbolic link where another one's target climbs out")
            joined = posixpath.join(posixpath.dirname(path), target)
            self.links[path] = self._resolve(name, joined, target)
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
        if not member.issym() and path in self.links:
            raise Refused(f"{name!r}: an entry in place of the symbolic link {path!r}")
        return path

    def _resolve(self, name: str, joined: str, target: str) -> list[str]:
        """_resolve: where a symbolic link's target leads, from the top, following the links
        before it as the filesystem will; refused if it leads out of the tree. A link may not
        later be made where this walk went up from: that would move where it leads."""
        stack: list[str] = []
        for part in joined.split("/"):
            if part in ("", "."):
                continue
            if part != "..":
                stack.append(part)
                for _ in range(MAX_HOPS):  # a link may lead to one made after it
                    led = self.links.get("/".join(stack), stack)
                    if led == stack:
                        break
                    stack = list(led)
                else:
                    raise Refused(f"{name!r}: a symbolic link through more than {MAX_HOPS} others")
                continue
            if not stack:
                raise Refused(f"{name!r}: a symbolic link out of the tree (to {target!r})")
            self.climbed.update("/".join(stack[:n]) for n in range(1, len(stack) + 1))
            stack.pop()
        return stack


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
