"""packages gives each pod of a job with a shipped working directory its own unpacked copy.

A package is fetched from the server once per node and kept under `packages/` in the data
directory (the agent's alone), named by its SHA-256: launches that need it while it is being
fetched wait for that one fetch. What arrives is checked against the hash and size the order
names before it is kept; what does not match is not kept, and the pod fails to start
(PackageUnavailable, as when the server cannot be reached: another attempt fetches again). A package
goes when the last job that used it here is purged; the cache starts empty with every agent
(a package is fetched again when a pod needs it).

Each pod gets the package unpacked into `work/` of its scratch directory, by `unpack` run as
the pod's own account (so it can write nowhere that account cannot), and starts there unless
its template names a working directory. A refused archive fails the pod for good
(PackageRefused, one of arranger.states.CANNOT_START: every attempt would be refused alike).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import structlog

from arranger.agent import unpack
from arranger.agent.config import PodUser
from arranger.agent.datadir import PRIVATE, make_dir
from arranger.agent.launcher import root_env
from arranger.agent.runtime import CONTAINER_SCRATCH, StartError
from arranger.states import PACKAGE_REFUSED
from arranger.v1 import agent_pb2, job_pb2

log = structlog.get_logger("arranger.agent")

WORK = "work"  # the pod's copy, under its scratch directory
MAX_UNPACKED_BYTES = 2**30  # what one package may unpack to, at most
NOT_STARTED = 126
UNPACK_SOURCE = Path(unpack.__file__).read_text()
Fetch = Callable[[str], AsyncIterator[bytes]]


def pod_cwd(order: agent_pb2.LaunchPod, scratch: Path, container: bool) -> Path | None:
    """pod_cwd: where a pod starts: its template's working directory if it names one, else
    its copy of the package (as a container sees it, for one), else None (the runtime's
    default, the scratch directory)."""
    if order.working_dir:
        return Path(order.working_dir)
    if not order.package.sha256:
        return None
    return Path(CONTAINER_SCRATCH, WORK) if container else scratch / WORK


class PackageCache:
    """PackageCache: packages on this node by hash, in `directory`; `fetch(sha256)` streams
    one from the server."""

    def __init__(self, directory: Path, fetch: Fetch, python: str) -> None:
        """`python`: the interpreter `unpack` runs in (one every pod's account may run)."""
        self.directory = directory
        self.fetch = fetch
        self.python = python
        self.fetched = 0  # packages fetched from the server since the agent started
        self._fetching: dict[str, asyncio.Task[Path]] = {}
        self._users: dict[str, set[str]] = {}  # package -> jobs that used it here
        shutil.rmtree(directory, ignore_errors=True)

    async def archive(self, package: job_pb2.Package) -> Path:
        """archive: the package's file on this node, fetched if it is not here yet (one fetch
        at a time per package). Raises StartError when it cannot be had or does not match."""
        path = self.directory / f"{package.sha256}.tar"
        if path.exists():
            return path
        task = self._fetching.get(package.sha256)
        if task is None:
            task = asyncio.create_task(self._download(package, path))
            self._fetching[package.sha256] = task
            task.add_done_callback(lambda _: self._fetching.pop(package.sha256, None))
        return await asyncio.shield(task)

    async def _download(self, package: job_pb2.Package, path: Path) -> Path:
        make_dir(self.directory, PRIVATE)
        part = path.with_suffix(f".part{os.getpid()}")
        digest, size = hashlib.sha256(), 0
        try:
            with await asyncio.to_thread(open, part, "wb") as out:
                async for data in self.fetch(package.sha256):
                    size += len(data)
                    if size > package.size:
                        raise StartError(
                            NOT_STARTED, f"PackageUnavailable: more than the {package.size} bytes "
                            f"of package {package.sha256[:12]} arrived",
                        )  # fmt: skip
                    digest.update(data)
                    await asyncio.to_thread(out.write, data)
            if size != package.size or digest.hexdigest() != package.sha256:
                raise StartError(
                    NOT_STARTED, f"PackageUnavailable: what arrived ({size} bytes, sha256 "
                    f"{digest.hexdigest()[:12]}) is not package {package.sha256[:12]}",
                )  # fmt: skip
            part.replace(path)
        except OSError as exc:
            raise StartError(
                NOT_STARTED, f"PackageUnavailable: cannot keep the package: {exc}"
            ) from exc
        finally:
            part.unlink(missing_ok=True)
        self.fetched += 1
        log.info("package fetched", sha256=package.sha256, size=size)
        return path

    def release(self, job_id: str) -> None:
        """release: the job is purged; packages no other job here used go."""
        for sha256, jobs in list(self._users.items()):
            jobs.discard(job_id)
            if not jobs and sha256 not in self._fetching:
                del self._users[sha256]
                (self.directory / f"{sha256}.tar").unlink(missing_ok=True)

    async def unpack_into(
        self, package: job_pb2.Package, scratch: Path, user: PodUser | None, job_id: str = ""
    ) -> Path:
        """unpack_into gives the pod (of job `job_id`) whose scratch directory this is its own
        copy of the package, in `work/` below it, made by (and owned by) `user` (None: the
        agent's own); returns that directory. Raises StartError when the archive is refused."""
        self._users.setdefault(package.sha256, set()).add(job_id)
        archive = await self.archive(package)
        work = scratch / WORK
        shutil.rmtree(work, ignore_errors=True)  # an attempt before this one's
        switch = user is not None and os.geteuid() == 0
        owner = (user.uid, user.gid) if switch and user is not None else None
        make_dir(work, PRIVATE, owner)
        argv = [self.python, "-I", "-S", "-c", UNPACK_SOURCE, str(MAX_UNPACKED_BYTES)]
        with await asyncio.to_thread(open, archive, "rb") as stdin:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                cwd=work, env=root_env(), start_new_session=True,
                user=user.uid if switch and user else None,
                group=user.gid if switch and user else None,
                extra_groups=list(user.groups) if switch and user else None,
            )  # fmt: skip
            _, err = await proc.communicate()
        if proc.returncode != 0:
            why = err.decode(errors="replace").strip().splitlines()[-1:] or [
                f"exit code {proc.returncode}"
            ]
            with contextlib.suppress(OSError):
                shutil.rmtree(work)
            raise StartError(
                NOT_STARTED, f"{PACKAGE_REFUSED}: package {package.sha256[:12]}: {why[0][:500]}"
            )
        return work
