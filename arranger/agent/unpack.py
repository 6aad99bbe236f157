"""unpack extracts a job's package into a pod's working directory, and nothing outside it.

It runs as the pod's own account, held to the pod's limits (see arranger.agent.packages): the
agent hands this file's source to `python -I -S -c` (so it imports nothing but the standard
library), the directory to fill as the current directory, the cap and the descriptor the
archive is read from as its arguments (without the descriptor: stdin).

Refused, naming the rule, from a header alone, before tarfile reads what it announces:
extended headers (pax, GNU long names) of more than MAX_HEADER_BYTES before one entry, or
global pax headers of more than that in all; a sparse file (its map may run past any bound);
more than MAX_ENTRIES entries. Refused, naming the entry: a name or link target of more than
MAX_NAME_BYTES bytes; a path that is absolute or has a `..` component, or that passes through
a symbolic link of the archive; a symbolic link whose target is absolute or leads out of the
tree (through the archive's links before it), or made where an earlier link's target went up
from; an entry in place of a symbolic link of the archive; a hard link to anything but a
regular file earlier in the archive; a device, fifo or any other special entry; more than the
cap of bytes in all. A refusal exits REFUSED with one line on stderr; what was extracted is
left for the agent to remove.
Modes keep the owner's bits and the read/execute bits of others (no setuid, no group/other
write); owners are never set; tarfile's `data` filter runs too where the Python has it.
"""

from __future__ import annotations

import posixpath
import sys
import tarfile
from collections.abc import Callable
from typing import IO

REFUSED = 3
MAX_ENTRIES = 200_000
MAX_NAME_BYTES = 4096  # a path or link target, as Linux's PATH_MAX
MAX_HEADER_BYTES = 64 * 1024  # extended headers before one entry, header blocks included
# Headers whose data tarfile reads whole into memory, to apply to the entry after them.
EXTENDED = (
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
)
MAX_HOPS = 40  # links followed in a row, as Linux does


class Refused(Exception):
    """Refused: an entry the archive may not hold, said in one line."""


class Checker:
    """Checker: what the entries seen so far allow of the next one (see the module)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.total = 0
        self.entries = 0
        self.extended = 0  # bytes of extended headers since the last entry
        self.globals = 0  # bytes of global pax headers in all (tarfile keeps them all)
        self.files: set[str] = set()
        self.links: dict[str, list[str]] = {}  # a symbolic link -> where it leads, from the top
        self.climbed: set[str] = set()  # paths a link's target went up ('..') out of

    def header(self, header: tarfile.TarInfo) -> None:
        """header: counts a header as tarfile reads it, before it reads the data the header
        announces; raises Refused past the bounds of the module (extended headers, sparse
        files, entries)."""
        if header.type in EXTENDED:
            size = tarfile.BLOCKSIZE + -(-header.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
            self.extended += size
            if self.extended > MAX_HEADER_BYTES:
                raise Refused(
                    f"extended headers (pax, GNU) of more than {MAX_HEADER_BYTES} bytes "
                    "before one entry"
                )
            if header.type == tarfile.XGLTYPE:
                self.globals += size
                if self.globals > MAX_HEADER_BYTES:
                    raise Refused(f"global pax headers of more than {MAX_HEADER_BYTES} bytes")
            return
        if header.type == tarfile.GNUTYPE_SPARSE:
            raise Refused(f"{_shown(header.name)}: a sparse file")
        self.extended = 0
        self.entries += 1
        if self.entries > MAX_ENTRIES:
            raise Refused(f"the package has more than {MAX_ENTRIES} entries")

    def check(self, member: tarfile.TarInfo) -> str:
        """check: the entry's normalised path; raises Refused when it may not be extracted."""
        name = member.name
        for what, value in (("a name", name), ("a link target", member.linkname)):
            if len(value.encode(errors="surrogateescape")) > MAX_NAME_BYTES:
                raise Refused(f"{_shown(name)}: {what} of more than {MAX_NAME_BYTES} bytes")
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


def _shown(name: str) -> str:
    """_shown: a name as a refusal says it: quoted, and cut short past 100 characters."""
    return repr(name) if len(name) <= 100 else f"{name[:100]!r}..."


def bounded(checker: Checker) -> type[tarfile.TarInfo]:
    """bounded: the TarInfo class that shows `checker` each header before tarfile reads what
    it announces (tarfile reads an extended header's data, or a sparse map, whole)."""

    class Bounded(tarfile.TarInfo):
        # _proc_member is where tarfile dispatches on a header's type; its source says that a
        # subclass may override it.
        def _proc_member(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
            checker.header(self)
            proc: Callable[[tarfile.TarFile], tarfile.TarInfo] = super()._proc_member  # type: ignore[misc]
            return proc(tar)

        def _proc_gnusparse_10(self, *_: object) -> None:  # a sparse map after a pax header
            raise Refused(f"{_shown(self.name)}: a sparse file")

    return Bounded


def unpack(archive: IO[bytes], dest: str, max_bytes: int) -> int:
    """unpack extracts the tar (gzipped or not) read from `archive` into `dest`, entry by entry as they
    stream; returns the bytes of its files. Raises Refused (see the module)."""
    checker = Checker(max_bytes)
    try:
        with tarfile.open(fileobj=archive, mode="r|*", tarinfo=bounded(checker)) as tar:
            while (member := tar.next()) is not None:
                # Streamed, an entry is never looked up again: tarfile need not keep them all.
                tar.members.clear()  # type: ignore[attr-defined]  # (not in typeshed)
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
    """main: `unpack.py MAX_BYTES [FD]`, into the current directory."""
    try:
        fd = int(sys.argv[2]) if len(sys.argv) > 2 else sys.stdin.fileno()
        with open(fd, "rb", closefd=False) as archive:
            unpack(archive, ".", int(sys.argv[1]))
    except Refused as exc:
        sys.stderr.write(f"{exc}\n")
        sys.exit(REFUSED)


if __name__ == "__main__":
    main()
