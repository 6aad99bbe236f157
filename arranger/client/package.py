"""package packs a working directory into a job's package and ships it to the server.

A package is a tar of the directory's regular files, directories and symbolic links that
stay inside it, minus what the ignore files leave out (see ignore), gzipped when a sample of
its files compresses (code does; checkpoints and data mostly do not, and gzip would cost
them more time than it saves on the way). It is deterministic:
entries are sorted by path, and every entry has mtime 0, owner 0:0 and no owner names, mode
0755 (directories and executables) or 0644, so the same tree always gives the same bytes and
the same SHA-256, which names the package. Other files (sockets, fifos, devices) are skipped.
A package larger than the cap (DEFAULT_MAX_BYTES, packed) is refused before anything is sent.

Shipping asks the server whether it holds the package's hash first and uploads it, in chunks
of CHUNK_BYTES, only if not: a second submit of the same tree sends nothing.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import os
import shutil
import stat
import sys
import tarfile
import tempfile
import zlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol, TypeVar, cast

from arranger.client.channel import ArrangerError
from arranger.client.ignore import IgnoreRules
from arranger.v1 import arranger_pb2, job_pb2

DEFAULT_MAX_BYTES = 100 * 2**20  # packed
PACKAGE_GONE = "spec.package: the server does not hold"  # see arranger.server.packages
CHUNK_BYTES = 2**20
RAW_FACTOR = 20  # a tree this many times the cap, unpacked, is refused without packing it
GZIP_LEVEL = 1  # fast: what compresses well (code) compresses well enough at 1
SAMPLE_BYTES = 16 * 2**10  # read from the start of each file to decide whether to gzip
SAMPLE_TOTAL_BYTES = 2**20
GZIP_BELOW = 0.9  # gzip when the sample shrinks below this share of its size

Submitted = TypeVar("Submitted")  # what the submit call answers


class PackageStore(Protocol):
    """PackageStore: the server's calls shipping makes (AsyncClient makes them)."""

    async def has_package(self, sha256: str) -> arranger_pb2.HasPackageResponse: ...

    async def upload_package(
        self, messages: Callable[[], AsyncGenerator[arranger_pb2.UploadPackageRequest, None]]
    ) -> arranger_pb2.UploadPackageResponse: ...


class PackageError(ValueError):
    """PackageError: a working directory that cannot be packed, said in one line."""


@dataclass(frozen=True)
class Packed:
    """Packed: a packed working directory: the archive's file, hash and size, and what it
    holds (regular files and their bytes)."""

    path: Path
    sha256: str
    size: int
    files: int
    file_bytes: int

    @property
    def message(self) -> job_pb2.Package:
        return job_pb2.Package(sha256=self.sha256, size=self.size)


@dataclass(frozen=True)
class Shipped:
    """Shipped: a package the server holds; `uploaded` says whether this call sent it."""

    package: job_pb2.Package
    uploaded: bool
    files: int
    file_bytes: int


def mib(size: float) -> str:
    return f"{size / 2**20:.1f} MiB"


def amount(size: float) -> str:
    """amount: a size in KiB below a MiB, else in MiB."""
    return mib(size) if size >= 2**20 else f"{size / 2**10:.1f} KiB"


def entries(top: Path) -> list[tuple[str, os.stat_result]]:
    """entries: what a package of `top` holds, by path relative to it ('/'-separated),
    sorted, each with its lstat; raises PackageError for a symbolic link out of the tree."""
    rules = IgnoreRules()
    found: list[tuple[str, os.stat_result]] = []
    real_top = os.path.realpath(top)

    def walk(directory: Path, rel: str) -> None:
        try:
            rules.read_dir(directory, rel)
            names = sorted(os.listdir(directory))
        except OSError as exc:
            raise PackageError(f"{directory}: {exc.strerror or exc}") from exc
        for name in names:
            path = directory / name
            inner = rel + name
            st = path.lstat()
            is_dir = stat.S_ISDIR(st.st_mode)
            if rules.ignored(inner, is_dir):
                continue
            if stat.S_ISLNK(st.st_mode):
                target = os.path.realpath(path)
                if os.path.commonpath([real_top, target]) != real_top:
                    raise PackageError(
                        f"{path}: a symbolic link out of the working directory (to "
                        f"{os.readlink(path)!r}); remove it or list it in .arrangerignore"
                    )
                found.append((inner, st))
            elif is_dir:
                found.append((inner, st))
                walk(path, inner + "/")
            elif stat.S_ISREG(st.st_mode):
                found.append((inner, st))

    if not top.is_dir():
        raise PackageError(f"working dir {top}: not a directory")
    walk(top, "")
    return found


def pack(top: Path, out_dir: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> Packed:
    """pack writes the package of `top` into a new file under `out_dir`; raises PackageError,
    naming the size and the cap, when it would be larger than `max_bytes`."""
    listed = entries(top)
    files = [(rel, st) for rel, st in listed if stat.S_ISREG(st.st_mode)]
    raw = sum(st.st_size for _, st in files)
    if raw > RAW_FACTOR * max_bytes:
        raise PackageError(
            f"working dir {top} holds {mib(raw)} in {len(files)} files, far above the package "
            f"cap of {mib(max_bytes)}; list what the job does not need in .arrangerignore"
        )
    fd, name = tempfile.mkstemp(prefix="arranger-package-", dir=out_dir)
    path = Path(name)
    try:
        with os.fdopen(fd, "wb") as raw_out:
            sink = _Hashing(raw_out)
            gz = (
                gzip.GzipFile(fileobj=sink, mode="wb", mtime=0, compresslevel=GZIP_LEVEL)
                if _compressible(top, files)
                else None
            )
            target = cast("IO[bytes]", gz or sink)  # sink is a file enough for tarfile
            with tarfile.open(fileobj=target, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for rel, st in listed:
                    _add(tar, top, rel, st)
            if gz is not None:
                gz.close()
        if sink.size > max_bytes:
            raise PackageError(
                f"working dir {top} packs to {mib(sink.size)} ({len(files)} files, "
                f"{mib(raw)} unpacked), above the cap of {mib(max_bytes)}; list what the job "
                "does not need in .arrangerignore"
            )
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return Packed(path, sink.digest.hexdigest(), sink.size, len(files), raw)


def _compressible(top: Path, files: list[tuple[str, os.stat_result]]) -> bool:
    """_compressible: whether the start of the files (SAMPLE_BYTES of each, in order, up to
    SAMPLE_TOTAL_BYTES) shrinks below GZIP_BELOW of its size at GZIP_LEVEL."""
    squeeze = zlib.compressobj(GZIP_LEVEL)
    taken = packed = 0
    for rel, _ in files:
        if taken >= SAMPLE_TOTAL_BYTES:
            break
        with open(top / rel, "rb") as f:
            data = f.read(min(SAMPLE_BYTES, SAMPLE_TOTAL_BYTES - taken))
        taken += len(data)
        packed += len(squeeze.compress(data))
    packed += len(squeeze.flush())
    return taken > 0 and packed < GZIP_BELOW * taken


def _add(tar: tarfile.TarFile, top: Path, rel: str, st: os.stat_result) -> None:
    info = tarfile.TarInfo(rel)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    executable = bool(st.st_mode & 0o100)
    if stat.S_ISDIR(st.st_mode):
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
    elif stat.S_ISLNK(st.st_mode):
        info.type, info.mode = tarfile.SYMTYPE, 0o777
        info.linkname = os.readlink(top / rel)
        tar.addfile(info)
    else:
        info.mode = 0o755 if executable else 0o644
        with open(top / rel, "rb") as f:
            info.size = os.fstat(f.fileno()).st_size
            tar.addfile(info, f)


class _Hashing:
    """_Hashing: a file object that passes writes on, counting and hashing them."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.size += len(data)
        return self.out.write(data)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.out.flush()


async def chunks(packed: Packed) -> AsyncGenerator[arranger_pb2.UploadPackageRequest, None]:
    """chunks: the upload's messages, the first naming the package."""
    f = await asyncio.to_thread(open, packed.path, "rb")
    try:
        first = True
        while data := await asyncio.to_thread(f.read, CHUNK_BYTES):
            msg = arranger_pb2.UploadPackageRequest(data=data)
            if first:
                msg.package.CopyFrom(packed.message)
                first = False
            yield msg
    finally:
        f.close()


async def ship(
    client: PackageStore, top: str | Path, max_bytes: int = DEFAULT_MAX_BYTES
) -> Shipped:
    """ship packs `top` and makes sure the server holds the package: it uploads it only when
    the server does not have it already. PackageError when it cannot be packed or is larger
    than this cap or the server's."""
    with tempfile.TemporaryDirectory(prefix="arranger-") as scratch:
        packed = await asyncio.to_thread(pack, Path(top), Path(scratch), max_bytes)
        have = await client.has_package(packed.sha256)
        if have.max_bytes and packed.size > have.max_bytes:
            raise PackageError(
                f"working dir {top} packs to {mib(packed.size)}, above the server's cap of "
                f"{mib(have.max_bytes)} (limits.packageBytes)"
            )
        uploaded = False
        if not have.present:
            reply = await client.upload_package(lambda: chunks(packed))
            uploaded = reply.stored
    return Shipped(packed.message, uploaded, packed.files, packed.file_bytes)


async def submit_shipping(
    client: PackageStore,
    job: job_pb2.TYJob,
    directory: str | Path,
    submit: Callable[[job_pb2.TYJob], Awaitable[Submitted]],
    shipped: Callable[[Shipped], None] | None = None,
) -> Submitted:
    """submit_shipping ships `directory`, names its package in `job` and submits it; should
    the server have let the package go since it said it held it, it ships it again, once.
    `shipped` is told how each shipping went."""
    for last in (False, True):
        done = await ship(client, directory)
        job.spec.package.CopyFrom(done.package)
        if shipped is not None:
            shipped(done)
        try:
            return await submit(job)
        except ArrangerError as exc:
            if last or not exc.message.startswith(PACKAGE_GONE):
                raise
    raise AssertionError("unreachable")


def working_dir_of(job: job_pb2.TYJob, job_file: str | Path) -> Path | None:
    """working_dir_of: the job's spec.workingDir, relative to the directory of its YAML file
    (None when it names none)."""
    if not job.spec.working_dir:
        return None
    return Path(job_file).parent / job.spec.working_dir


def unshipped_files(job: job_pb2.TYJob, directory: str | Path | None) -> list[str]:
    """unshipped_files: a warning for each word of a template's command or args that names a
    file of the current directory by a relative path, which no PATH lookup finds, when nothing
    ships that directory (no workingDir, on the command line or in the spec) and the template
    names no working directory of its own: the pod, started elsewhere, would not find it."""
    if directory is not None or job.spec.working_dir or job.spec.HasField("package"):
        return []
    spec = job.spec
    templates = [("spec.leader.template", spec.leader.template)] + [
        (f"spec.workerSets[{i}].template", ws.template) for i, ws in enumerate(spec.worker_sets)
    ]
    warned = []
    for path, template in templates:
        if template.working_dir:
            continue
        for key in ("command", "args"):
            for word in dict.fromkeys(getattr(template, key)):
                if _local_file(word):
                    warned.append(
                        f"{path}.{key} names {word}, which is in this directory but no "
                        "workingDir ships it; add `workingDir: .`"
                    )
    return warned[:MAX_WARNINGS]


MAX_WARNINGS = 5  # unshipped_files' warnings shown for one job


def _local_file(word: str) -> bool:
    """_local_file: whether `word` is a relative path to a file of the current directory that
    no PATH lookup finds (a bare name on PATH runs from there, not from here)."""
    if not word or word.startswith("-") or os.path.isabs(word) or len(word) > 4096:
        return False
    try:
        if not Path(word).is_file():
            return False
    except (OSError, ValueError):
        return False
    return "/" in word or shutil.which(word) is None


def warn_unshipped(job: job_pb2.TYJob, directory: str | Path | None) -> None:
    """warn_unshipped prints unshipped_files' warnings on standard error; the job is
    submitted all the same."""
    for line in unshipped_files(job, directory):
        print(f"warning: {line}", file=sys.stderr, flush=True)


def shipped_line(done: Shipped) -> str:
    """shipped_line: what a submit says of the package it shipped."""
    how = "uploaded" if done.uploaded else "already on the server, not uploaded"
    return (
        f"working dir: {done.files} files ({amount(done.file_bytes)}), "
        f"{amount(done.package.size)} "
        f"packed, sha256 {done.package.sha256[:12]}: {how}"
    )
