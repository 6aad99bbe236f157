"""packages serves jobs' working directories: uploads from users, fetches by agents.

A package is a tar (gzipped or not) of a working directory, named by its SHA-256 (see
arranger.client.package). It lives in the store, in rows of at most a MiB, so that a standby
that takes over holds it too and no step holds one whole in memory.

- An upload is a stream of chunks whose first message names the package. It is refused as soon
  as it passes the size it announced or `limits.packageBytes`, or sends more messages than
  one per AVERAGE_CHUNK_BYTES (and two); what arrives is spooled to a
  temporary file and hashed, and stored only if its hash and size are those announced.
  Uploads of one hash are made one at a time: a second finds the first's and stores nothing.
  A user may have MAX_UPLOADS_PER_USER uploads under way at once (one that sends nothing for
  UPLOAD_IDLE_S is dropped); HasPackage of a package the
  store lacks already refuses one more (a refused stream can reach the client as INTERNAL).
- A package belongs to the users who uploaded it: its hash is no capability. HasPackage
  answers "no" to another user, a job may name a package only once the store holds it whole
  and its owner owns it (SubmitJob checks), and one who uploads content another user holds
  sends it all, is told it was stored, and owns it too: no answer tells a user that someone
  else holds a package. Admins may read, and name, every package.
- What each user keeps is bounded by `limits.storedPackageBytesPerUser` (see package_quota).
- Logs and refusals name a package by the first SHORT hex digits of its hash, never all: the
  whole hash is what its owners' jobs name it by.
- An agent fetches a package for a pod of a job that names it placed on its node: with TLS
  the node is the one its certificate names.
- Retention deletes a package with the last job that names it, and one no job names a day
  after it was last uploaded or asked for (see retention).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import structlog

from arranger.identity import caller
from arranger.server.limits import UserLimits
from arranger.server.model import JobRecord
from arranger.server.package_quota import PackageQuota
from arranger.server.store import Store, StoreError
from arranger.server.view import ClusterView
from arranger.v1 import arranger_pb2, job_pb2

log = structlog.get_logger("arranger.server")

SHA256 = re.compile(r"^[0-9a-f]{64}$")
MAX_CHUNK_BYTES = 2**20  # an upload message's data, at most
AVERAGE_CHUNK_BYTES = 4096  # an upload's messages carry at least this much each, on average
UPLOAD_IDLE_S = 60.0  # an upload that sends nothing this long is dropped (its slot freed)
MAX_UPLOADS_PER_USER = 4  # under way at once (each spools up to limits.packageBytes)
SHORT = 12  # hex digits of a package's hash that logs and refusals show
GONE = "spec.package: the server does not hold"  # a submit's refusal; the SDK uploads again


def short(sha256: str) -> str:
    """short: how logs and refusals name a package (see SHORT)."""
    return sha256[:SHORT]


class PackageRefused(Exception):
    """PackageRefused: a package call refused, with its gRPC status name and one line."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Packages:
    """Packages: the package calls of one server over its store (`store_of()`: the server's
    store, opened after its handlers are made); `max_bytes` is the server's
    `limits.packageBytes`, `quota_bytes` its `limits.storedPackageBytesPerUser`."""

    store_of: Callable[[], Store]
    view: ClusterView
    max_bytes: int
    quota_bytes: int = UserLimits.stored_package_bytes_per_user
    _uploading: dict[str, tuple[asyncio.Lock, int]] = field(default_factory=dict)
    _uploads_by: dict[str, int] = field(default_factory=dict)  # user -> uploads under way

    def __post_init__(self) -> None:
        self.quota = PackageQuota(self.quota_bytes, self.store_of)

    @property
    def store(self) -> Store:
        return self.store_of()

    async def has(self, sha256: str, now: float) -> arranger_pb2.HasPackageResponse:
        """has: whether the store holds the package for the caller (theirs, or any for an
        admin); one held is kept another day by pruning, for the submit that follows."""
        if not SHA256.fullmatch(sha256):
            raise PackageRefused("INVALID_ARGUMENT", "sha256: must be 64 lowercase hex digits")
        who = caller()
        present = await self.store.touch_package(sha256, now, None if who.admin else who.user)
        if not present:  # the upload that follows would be refused: say so now, in one answer
            self._check_uploads(who.user)
        return arranger_pb2.HasPackageResponse(present=present, max_bytes=self.max_bytes)

    def _check_uploads(self, user: str) -> None:
        """_check_uploads refuses a user who has MAX_UPLOADS_PER_USER uploads under way."""
        under_way = self._uploads_by.get(user, 0)
        if under_way >= MAX_UPLOADS_PER_USER:
            raise PackageRefused(
                "RESOURCE_EXHAUSTED",
                f"uploads: user {user!r} has {under_way} package uploads under way (at most "
                f"{MAX_UPLOADS_PER_USER}); wait for them to end",
            )

    async def missing(self, package: job_pb2.Package, owner: str | None) -> str:
        """missing: why a job of `owner` (None: an admin's) may not name this package (""
        if it may). One the store holds for another user only is missing: it says nothing
        of whether anyone holds it."""
        size = await self.store.package_size(package.sha256, owner)
        name = short(package.sha256)
        if size is None:
            whose = "" if owner is None else f" for user {owner!r}"
            return (
                f"{GONE} package {name}{whose}; upload it first (arranger submit and the SDK's "
                "submit do)"
            )
        if size != package.size:
            return f"spec.package.size: {package.size} is not the size of package {name} ({size})"
        return ""

    async def upload(
        self, requests: AsyncIterator[arranger_pb2.UploadPackageRequest], now: float
    ) -> arranger_pb2.UploadPackageResponse:
        """upload receives, checks and stores one package (see the module's docstring)."""
        user = caller().user
        self._check_uploads(user)
        self._uploads_by[user] = self._uploads_by.get(user, 0) + 1
        try:
            return await self._upload(user, requests, now)
        finally:
            left = self._uploads_by[user] - 1
            if left:
                self._uploads_by[user] = left
            else:
                del self._uploads_by[user]

    async def _upload(
        self, user: str, requests: AsyncIterator[arranger_pb2.UploadPackageRequest], now: float
    ) -> arranger_pb2.UploadPackageResponse:
        """_upload: `stored` in its answer says the package was not `user`'s before (whether
        or not another user held it)."""
        stream = aiter(requests)
        first = await self._next(stream)
        if first is None or not first.HasField("package"):
            raise PackageRefused("INVALID_ARGUMENT", "package: the first message must name it")
        sha256, size = first.package.sha256, first.package.size
        if not SHA256.fullmatch(sha256):
            raise PackageRefused(
                "INVALID_ARGUMENT", "package.sha256: must be 64 lowercase hex digits"
            )
        if not 0 < size <= self.max_bytes:
            raise PackageRefused(
                "RESOURCE_EXHAUSTED" if size > 0 else "INVALID_ARGUMENT",
                f"limits.packageBytes: the package is {size} bytes; packages may be 1 to "
                f"{self.max_bytes} bytes",
            )
        async with self.quota.holding(user, sha256, size) as over:
            if over:
                raise PackageRefused("RESOURCE_EXHAUSTED", over)
            stored, received = await self._spool(user, first, stream, now)
        if stored:
            log.info("package stored", sha256=short(sha256), size=size, user=user)
        return arranger_pb2.UploadPackageResponse(
            package=first.package, stored=stored, received_bytes=received
        )

    async def _spool(
        self,
        user: str,
        first: arranger_pb2.UploadPackageRequest,
        stream: AsyncIterator[arranger_pb2.UploadPackageRequest],
        now: float,
    ) -> tuple[bool, int]:
        """_spool receives the upload into a temporary file and stores it as `user`'s; returns
        whether it was not theirs before, and the bytes received."""
        sha256, size = first.package.sha256, first.package.size
        with tempfile.NamedTemporaryFile(prefix="arranger-package-") as spool:
            digest, received = await self._receive(first, stream, spool, size)
            if received != size or digest != sha256:
                raise PackageRefused(
                    "INVALID_ARGUMENT",
                    f"package: received {received} bytes with sha256 {short(digest)}, not the "
                    f"{size} bytes with sha256 {short(sha256)} announced; nothing was stored",
                )
            spool.flush()
            lock, users = self._uploading.get(sha256, (asyncio.Lock(), 0))
            self._uploading[sha256] = (lock, users + 1)
            try:
                async with lock:
                    stored = await self.store.put_package(sha256, size, now, Path(spool.name), user)
            finally:
                lock, users = self._uploading[sha256]
                if users == 1:
                    del self._uploading[sha256]
                else:
                    self._uploading[sha256] = (lock, users - 1)
        return stored, received

    async def _receive(
        self,
        first: arranger_pb2.UploadPackageRequest,
        rest: AsyncIterator[arranger_pb2.UploadPackageRequest],
        spool: IO[bytes],
        size: int,
    ) -> tuple[str, int]:
        """_receive spools the upload's data; returns its hash and size. Past `size` (or a
        message over MAX_CHUNK_BYTES) it is refused at once."""
        digest = hashlib.sha256()
        received = 0

        async def messages() -> AsyncIterator[arranger_pb2.UploadPackageRequest]:
            yield first
            while (msg := await self._next(rest)) is not None:
                yield msg

        most = size // AVERAGE_CHUNK_BYTES + 2  # a flood of tiny messages is not an upload
        count = 0
        async for msg in messages():
            count += 1
            if count > most:
                raise PackageRefused(
                    "INVALID_ARGUMENT",
                    f"package: more than {most} messages for {size} bytes; send up to "
                    f"{MAX_CHUNK_BYTES} bytes a message",
                )
            data = msg.data
            if len(data) > MAX_CHUNK_BYTES:
                raise PackageRefused(
                    "INVALID_ARGUMENT", f"data: a message may carry {MAX_CHUNK_BYTES} bytes at most"
                )
            received += len(data)
            if received > size:
                raise PackageRefused(
                    "INVALID_ARGUMENT",
                    f"package: more than the {size} bytes announced arrived; nothing was stored",
                )
            digest.update(data)
            await asyncio.to_thread(spool.write, data)
        return digest.hexdigest(), received

    async def _next(
        self, stream: AsyncIterator[arranger_pb2.UploadPackageRequest]
    ) -> arranger_pb2.UploadPackageRequest | None:
        """_next: the upload's next message (None at its end); one that does not come within
        UPLOAD_IDLE_S ends the upload, so that a stalled client does not hold its slot."""
        try:
            async with asyncio.timeout(UPLOAD_IDLE_S):
                return await anext(stream)
        except StopAsyncIteration:
            return None
        except TimeoutError:
            raise PackageRefused(
                "DEADLINE_EXCEEDED",
                f"package: nothing arrived for {UPLOAD_IDLE_S:g} s; the upload was dropped",
            ) from None

    def may_fetch(self, sha256: str, node: str) -> bool:
        """may_fetch: whether `node` holds (or held) a pod of a job that names the package."""
        return any(_names(job, sha256) for job in self.view.jobs_on(node))

    async def fetch(self, sha256: str, node: str) -> AsyncIterator[bytes]:
        """fetch: the package's bytes for `node`, a row at a time (see may_fetch)."""
        if not SHA256.fullmatch(sha256):
            raise PackageRefused("INVALID_ARGUMENT", "sha256: must be 64 lowercase hex digits")
        if not self.may_fetch(sha256, node):
            raise PackageRefused(
                "PERMISSION_DENIED",
                f"package {short(sha256)}: no job that names it has a pod on node {node!r}",
            )
        try:
            size = await self.store.package_size(sha256)
            if size is None:
                raise PackageRefused(
                    "NOT_FOUND", f"package {short(sha256)} is not held by the store"
                )
            async for chunk in self.store.package_chunks(sha256, size):
                yield chunk
        except StoreError as exc:
            raise PackageRefused("UNAVAILABLE", f"package {short(sha256)}: {exc}") from exc


def _names(job: JobRecord, sha256: str) -> bool:
    return job.spec.package is not None and job.spec.package.sha256 == sha256
