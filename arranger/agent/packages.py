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
its template names a working directory. The unpacker is held as the pod is (see Unpacker): it
starts the way pods start (the shim, then setpriv and the launcher to become the pod's user:
the agent never forks to switch user), in a cgroup with the pod's memory, CPU and pids limits
where the node has cgroups, and it is stopped, with its process group and its cgroup, past a
timeout. A refused archive, an unpacker killed for the pod's memory or stopped at the timeout
fail the pod for good (PackageRefused, one of arranger.states.CANNOT_START: every attempt
would be refused alike); an unpacker that cannot be started fails it as a StartError.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from arranger.agent import launcher, process, unpack
from arranger.agent.cgroups import Cgroups, PodCgroup, pod_pids
from arranger.agent.config import PodUser
from arranger.agent.datadir import PRIVATE, make_dir
from arranger.agent.launcher import root_env
from arranger.agent.orders import LaunchOrder, Package
from arranger.agent.runtime import CONTAINER_SCRATCH, PodLaunch, ProcessRuntime, StartError
from arranger.states import PACKAGE_REFUSED

log = structlog.get_logger("arranger.agent")

WORK = "work"  # the pod's copy, under its scratch directory
MAX_UNPACKED_BYTES = 2**30  # what one package may unpack to, at most
NOT_STARTED = 126
SHIM_REFUSED = 125  # the unpacker's shim could not join its cgroup (see process)
UNPACK_TIMEOUT_S = 600.0  # a package's unpacking, at most, before the pod fails
UNPACK_SOURCE = Path(unpack.__file__).read_text()
Fetch = Callable[[str], AsyncIterator[bytes]]


@dataclass(frozen=True)
class Unpacker:
    """Unpacker: how a pod's package is unpacked: started as the node starts pods (`tools`),
    in a cgroup of `cgroups` (None: this node has none) named after the pod attempt (`name`,
    its key) with the pod's limits (memory_bytes, cpu_milli, pids; 0: none), and stopped,
    with everything it started, once it has run timeout_s."""

    tools: launcher.Tools
    cgroups: Cgroups | None = None
    name: str = "unpack"
    memory_bytes: int = 0
    cpu_milli: int = 0
    pids: int = 0
    timeout_s: float = UNPACK_TIMEOUT_S

    def cgroup(self) -> PodCgroup | None:
        """cgroup: a fresh cgroup with the pod's limits (beside the pod's own, which its
        runtime makes when it starts it), or None where there are none (or it cannot be made:
        then only the timeout holds the unpacker, as a pod runs without limits then)."""
        if self.cgroups is None:
            return None
        try:
            return self.cgroups.create(
                f"{self.name}-unpack", self.memory_bytes, self.cpu_milli, self.pids
            )
        except OSError as exc:
            log.warning("the unpacker runs without limits", pod=self.name, error=str(exc))
            return None

    async def run(
        self, argv: Sequence[str], cwd: Path, archive_fd: int, user: PodUser | None, short: str
    ) -> None:
        """run runs the unpacker's argv in `cwd` as `user` (None: the agent's own) with the
        archive open on `archive_fd`; raises StartError when it did not unpack (package
        `short`)."""
        cgroup = self.cgroup()
        try:
            child, spec, output = process.spawn_helper(
                argv,
                root_env(),
                cwd,
                self.tools,
                user,
                cgroup.procs if cgroup else (),
                (archive_fd,),
            )
        except (OSError, launcher.LaunchError) as exc:
            if cgroup is not None:
                cgroup.remove()
            raise StartError(NOT_STARTED, f"StartError: cannot start the unpacker: {exc}") from exc
        late = False
        try:
            try:
                async with asyncio.timeout(self.timeout_s):
                    code = await process.wait_exit(child)
            except TimeoutError:
                late = True
                process.signal_group(child.pid, signal.SIGKILL)
                code = await process.wait_exit(child)
            oom = cgroup is not None and cgroup.oom_killed()
            failed = launcher.failure(spec)
            size = os.fstat(output).st_size
            said = os.pread(output, 4096, max(0, size - 4096)).decode(errors="replace")
        finally:  # stopped (the pod was) or not, nothing of it outlives this
            process.signal_group(child.pid, signal.SIGKILL)
            os.close(spec)
            os.close(output)
            if cgroup is not None:
                cgroup.kill()
                cgroup.remove()
        last = said.strip().splitlines()[-1:] or [f"exit code {code}"]
        refused = f"{PACKAGE_REFUSED}: package {short}"
        if late:
            raise StartError(
                NOT_STARTED, f"{refused}: unpacking took more than {self.timeout_s:g} s: stopped"
            )
        if oom:
            raise StartError(
                NOT_STARTED,
                f"{refused}: unpacking needs more than the pod's memory "
                f"({self.memory_bytes} bytes): killed",
            )
        if failed is not None:
            raise StartError(NOT_STARTED, f"StartError: cannot start the unpacker: {failed[1]}")
        if code == SHIM_REFUSED:
            raise StartError(NOT_STARTED, f"StartError: the unpacker did not start: {last[0]}")
        if code != 0:
            raise StartError(NOT_STARTED, f"{refused}: {last[0][:500]}")


def pod_cwd(order: LaunchOrder, scratch: Path, container: bool) -> Path | None:
    """pod_cwd: where a pod starts: its template's working directory if it names one, else
    its copy of the package (as a container sees it, for one), else None (the runtime's
    default, the scratch directory)."""
    if order.working_dir:
        return Path(order.working_dir)
    if order.package is None:
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

    async def archive(self, package: Package) -> Path:
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

    async def _download(self, package: Package, path: Path) -> Path:
        make_dir(self.directory, PRIVATE)
        part = path.with_suffix(f".part{os.getpid()}")
        digest, size = hashlib.sha256(), 0
        try:
            with await asyncio.to_thread(open, part, "wb") as out:
                async for data in self.fetch(package.sha256):
                    size += len(data)
                    if size > package.size:
                        raise StartError(
                            NOT_STARTED,
                            f"PackageUnavailable: more than the {package.size} bytes "
                            f"of package {package.sha256[:12]} arrived",
                        )
                    digest.update(data)
                    await asyncio.to_thread(out.write, data)
            if size != package.size or digest.hexdigest() != package.sha256:
                raise StartError(
                    NOT_STARTED,
                    f"PackageUnavailable: what arrived ({size} bytes, sha256 "
                    f"{digest.hexdigest()[:12]}) is not package {package.sha256[:12]}",
                )
            part.replace(path)
        except OSError as exc:
            raise StartError(
                NOT_STARTED, f"PackageUnavailable: cannot keep the package: {exc}"
            ) from exc
        finally:
            part.unlink(missing_ok=True)
        self.fetched += 1
        log.info("package fetched", sha256=package.sha256[:12], size=size)  # as the server says it
        return path

    def release(self, job_id: str) -> None:
        """release: the job is purged; packages no other job here used go."""
        for sha256, jobs in list(self._users.items()):
            jobs.discard(job_id)
            if not jobs and sha256 not in self._fetching:
                del self._users[sha256]
                (self.directory / f"{sha256}.tar").unlink(missing_ok=True)

    @staticmethod
    def unpacker_for(launch: PodLaunch, runtime: ProcessRuntime) -> Unpacker:
        """unpacker_for: the unpacker of `launch`'s pod, whatever runtime runs the pod: started
        with the process runtime's tools, held to the limits it gives a pod, in its cgroups."""
        order = launch.order
        pids = pod_pids(order.pids, runtime.pids, runtime.nproc)
        return Unpacker(
            runtime.tools,
            runtime.cgroups,
            launch.key,
            order.memory_bytes,
            round(order.cpu_cores * 1000),
            pids,
        )

    async def unpack_into(
        self,
        package: Package,
        scratch: Path,
        user: PodUser | None,
        job_id: str = "",
        unpacker: Unpacker | None = None,
    ) -> Path:
        """unpack_into gives the pod (of job `job_id`) whose scratch directory this is its own
        copy of the package, in `work/` below it, made by (and owned by) `user` (None: the
        agent's own) with `unpacker` (default: the shell's shim and the Python launcher, no
        cgroup); returns that directory. Raises StartError when the archive is refused."""
        self._users.setdefault(package.sha256, set()).add(job_id)
        archive = await self.archive(package)
        work = scratch / WORK
        shutil.rmtree(work, ignore_errors=True)  # an attempt before this one's
        switch = user is not None and os.geteuid() == 0
        owner = (user.uid, user.gid) if switch and user is not None else None
        make_dir(work, PRIVATE, owner)
        if unpacker is None:
            unpacker = Unpacker(launcher.Tools(launcher.which("setpriv"), self.python))
        with await asyncio.to_thread(open, archive, "rb") as data:
            fd = data.fileno()
            argv = [self.python, "-I", "-S", "-c", UNPACK_SOURCE, str(MAX_UNPACKED_BYTES), str(fd)]
            try:
                await unpacker.run(argv, work, fd, user if switch else None, package.sha256[:12])
            except StartError:
                with contextlib.suppress(OSError):
                    shutil.rmtree(work)
                raise
        return work
