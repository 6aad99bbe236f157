"""The agent's package cache: one fetch per package however many pods wait for it, checked
against its hash, and unpacked by the pod's own account into the pod's directory, by an
unpacker held as the pod is: in a cgroup with the pod's limits (skipped where this machine's
cgroups cannot be written), under a timeout, started as pods are (never a fork of the agent)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import os
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from arranger.agent import packages
from arranger.agent.cgroups import Cgroups
from arranger.agent.config import PodUser
from arranger.agent.launcher import find_tools
from arranger.agent.orders import LaunchOrder, Package
from arranger.agent.packages import PackageCache, Unpacker
from arranger.agent.runs import PodRun
from arranger.agent.runtime import StartError
from arranger.agent.supervisor import Supervisor
from arranger.states import PodState
from arranger.v1 import job_pb2
from tests.agent.rootagent import local_users, needs_root, order, root_agent, shared_dir
from tests.agent.test_unpack import MIB, gzipped, header
from tests.conftest import eventually

# Stands in for the unpacker: writes what holds it (its cgroups, their memory and pids
# limits) to `shown`, in the directory it fills.
SHOW_CGROUP = """
import pathlib
root = pathlib.Path("/sys/fs/cgroup")
shown = []
for line in pathlib.Path("/proc/self/cgroup").read_text().splitlines():
    shown.append(line)
    _, controllers, path = line.split(":", 2)
    here = root / controllers / path.lstrip("/")
    for knob in ("memory.limit_in_bytes", "memory.max", "pids.max"):
        if (here / knob).is_file():
            shown.append(f"{knob} {(here / knob).read_text().strip()}")
pathlib.Path("shown").write_text("\\n".join(shown) + "\\n")
"""


def archive(files: dict[str, bytes], link: tuple[str, str] | None = None) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        if link is not None:
            info = tarfile.TarInfo(link[0])
            info.type, info.linkname = tarfile.SYMTYPE, link[1]
            tar.addfile(info)
    return out.getvalue()


def package_of(data: bytes) -> Package:
    return Package(sha256=hashlib.sha256(data).hexdigest(), size=len(data))


async def shipped_pod(
    data_dir: Path, cgroups: Cgroups, data: bytes, memory: int, pids: int = 0
) -> tuple[PodRun, str]:
    """shipped_pod: a pod of `memory` bytes and `pids` processes whose working directory is
    package `data`, run by a supervisor with `cgroups` (it shows the file `shown` there); its
    run and its log, once it ended."""
    done = asyncio.Event()

    async def fetch(sha256: str) -> AsyncIterator[bytes]:
        yield data

    supervisor = Supervisor(
        "n1",
        "127.0.0.1",
        data_dir,
        lambda run: run.ended.is_set() and done.set(),
        cgroups=cgroups,
        fetch_package=fetch,
    )
    launch = LaunchOrder(
        uid="j1/p",
        attempt=0,
        job_id="j1",
        pod_name="p",
        cpu_cores=0.5,
        memory_bytes=memory,
        pids=pids,
        command=("/bin/cat", "shown"),
        package=package_of(data),
    )
    supervisor.launch(launch)
    await asyncio.wait_for(done.wait(), 60)
    return supervisor.runs["j1/p"], supervisor.files.log_path("j1/p", 0).read_text()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class Server:
    """Server: what the agent fetches from, counting fetches, held until `go` is set."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.fetches = 0
        self.go = asyncio.Event()

    async def fetch(self, sha256: str) -> AsyncIterator[bytes]:
        self.fetches += 1
        await self.go.wait()
        for i in range(0, len(self.data), 7):
            yield self.data[i : i + 7]


async def test_pods_waiting_for_one_package_fetch_it_once(tmp_path: Path) -> None:
    data = archive({"train.py": b"print(1)\n"})
    server = Server(data)
    cache = PackageCache(tmp_path / "packages", server.fetch, find_tools(False, False).python)
    waiting = [asyncio.ensure_future(cache.archive(package_of(data))) for _ in range(3)]
    await asyncio.sleep(0)  # every launch is waiting before the one fetch ends
    server.go.set()
    paths = await asyncio.gather(*waiting)
    assert server.fetches == 1 and cache.fetched == 1
    assert len(set(paths)) == 1 and paths[0].read_bytes() == data
    await cache.archive(package_of(data))  # kept on this node
    assert server.fetches == 1


async def test_a_package_goes_with_the_last_job_that_used_it(tmp_path: Path) -> None:
    data = archive({"train.py": b"print(1)\n"})
    server = Server(data)
    server.go.set()
    cache = PackageCache(tmp_path / "packages", server.fetch, find_tools(False, False).python)
    for job in ("j1", "j2"):
        (tmp_path / job).mkdir()
        work = await cache.unpack_into(package_of(data), tmp_path / job, None, job)
        assert (work / "train.py").read_bytes() == b"print(1)\n"
    cache.release("j1")
    assert server.fetches == 1 and len(list((tmp_path / "packages").iterdir())) == 1
    cache.release("j2")
    assert list((tmp_path / "packages").iterdir()) == []


async def test_what_does_not_match_its_hash_is_refused_and_not_kept(tmp_path: Path) -> None:
    data = archive({"train.py": b"print(1)\n"})
    server = Server(data[:-1] + b"!")
    server.go.set()
    cache = PackageCache(tmp_path / "packages", server.fetch, find_tools(False, False).python)
    with pytest.raises(StartError, match=r"PackageUnavailable: what arrived .* is not package"):
        await cache.archive(package_of(data))
    assert list((tmp_path / "packages").iterdir()) == []


@needs_root
async def test_a_package_is_unpacked_by_the_pods_own_account() -> None:
    good = archive({"train.py": b"print(1)\n", "pkg/m.py": b"X = 1\n"})
    bad = archive({"ok.py": b""}, link=("etc", "/etc"))
    with local_users(1) as (user,), shared_dir() as top:
        pod_user = PodUser.of(user)
        servers = {package_of(d).sha256: d for d in (good, bad)}

        async def fetch(sha256: str) -> AsyncIterator[bytes]:
            yield servers[sha256]

        cache = PackageCache(top / "packages", fetch, find_tools(True, False).python)
        scratch = top / "scratch"
        scratch.mkdir(mode=0o700)
        os.chown(scratch, user.pw_uid, user.pw_gid)
        work = await cache.unpack_into(package_of(good), scratch, pod_user)
        assert work == scratch / "work"
        assert (work / "pkg" / "m.py").read_text() == "X = 1\n"
        for path in (work, work / "pkg", work / "train.py", work / "pkg" / "m.py"):
            assert (path.stat().st_uid, path.stat().st_gid) == (user.pw_uid, user.pw_gid), path
        with pytest.raises(StartError, match=r"PackageRefused: .*'etc': a symbolic link to the"):
            await cache.unpack_into(package_of(bad), scratch, pod_user)
        assert not (scratch / "work").exists()


@pytest.mark.e2e
@needs_root
async def test_shipped_working_directories_unpack_as_another_user_beside_live_grpc(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A root agent (its gRPC channel and the server's live in this process) unpacks 20 shipped
    working directories as another user: each pod starts in its copy. Forking a process that
    calls into gRPC to switch user crashed some of them (gRPC's fork handler), for good; so no
    fork may run that handler (which logs "fork_posix.cc: ... skipping fork() handlers")."""
    data = archive({"train.py": b"print('trained')\n"})
    package = package_of(data)
    wire = job_pb2.Package(sha256=package.sha256, size=package.size)  # as the server orders it

    async def fetch(sha256: str) -> AsyncIterator[bytes]:
        yield data

    with local_users(1) as (user,), shared_dir() as top:
        async with root_agent(top, user=user.pw_name) as node:
            cache = node.agent.supervisor.packages
            assert cache is not None
            cache.fetch = fetch  # the server gives packages only to jobs it placed
            uids = [f"j{i}/p" for i in range(20)]
            node.launch(*(order(uid, ["/bin/cat", "train.py"], package=wire) for uid in uids))
            for uid in uids:
                report = await node.ended(uid, timeout_s=60)
                assert report.state == PodState.SUCCEEDED, (uid, report.reason, node.log(uid))
                assert node.log(uid) == "print('trained')\n"
    assert "fork_posix" not in capfd.readouterr().err, "gRPC's fork handlers ran"


async def test_the_unpacker_runs_in_a_cgroup_with_the_pods_limits(
    tmp_path: Path, cgroups: Cgroups, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(packages, "UNPACK_SOURCE", SHOW_CGROUP)
    run, log = await shipped_pod(tmp_path, cgroups, archive({}), 256 * MIB, pids=77)
    assert run.state == PodState.SUCCEEDED, (run.reason, log)
    lines = log.splitlines()
    own = f"/arranger/test-{os.getpid()}/j1_p.0-unpack"
    held = {c for line in lines if line.endswith(own) for c in line.split(":")[1].split(",")}
    if cgroups.version == 1:
        assert held >= set(cgroups.bases) >= {"memory", "cpu", "pids"}, log
        assert f"memory.limit_in_bytes {256 * MIB}" in lines, log
    else:
        assert held == {""}, log  # the one hierarchy
        assert f"memory.max {256 * MIB}" in lines, log
    assert "pids.max 77" in lines, log
    assert not any((base / "j1_p.0-unpack").exists() for base in cgroups.bases.values())


async def test_a_package_of_huge_pax_headers_is_held_to_the_pods_memory(
    tmp_path: Path, cgroups: Cgroups, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The review's package (a pax header of 256 MiB, in under 1 MB) in a pod of 64 MiB: the
    unpacker refuses it from its header; with that bound lifted, the pod's memory limit kills
    the unpacker that reads it, and the pod fails saying so."""
    size = 256 * MIB
    hostile = gzipped(
        header("./PaxHeaders/shown", tarfile.XHDTYPE, size),
        header("shown", tarfile.REGTYPE, 0),
        zeros=size,
    ).getvalue()
    refused = f"PackageRefused: package {package_of(hostile).sha256[:12]}: "
    run, log = await shipped_pod(tmp_path / "bounded", cgroups, hostile, 64 * MIB)
    assert (run.state, run.reason) == (
        PodState.FAILED,
        refused + "extended headers (pax, GNU) of more than 65536 bytes before one entry",
    ), log
    unbounded = packages.UNPACK_SOURCE.replace(
        "MAX_HEADER_BYTES = 64 * 1024", "MAX_HEADER_BYTES = 2**40"
    )
    assert unbounded != packages.UNPACK_SOURCE
    monkeypatch.setattr(packages, "UNPACK_SOURCE", unbounded)
    run, log = await shipped_pod(tmp_path / "unbounded", cgroups, hostile, 64 * MIB)
    assert (run.state, run.reason) == (
        PodState.FAILED,
        refused + f"unpacking needs more than the pod's memory ({64 * MIB} bytes): killed",
    ), log


class Stalled:
    """Stalled: a package cache whose unpacker starts a child, writes both pids to `started`,
    and waits (as long as the test lets it)."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started = tmp_path / "started"
        stall = (
            "import os, pathlib, signal, subprocess\n"
            "child = subprocess.Popen(['sleep', '600'])\n"
            f"pathlib.Path({str(self.started)!r}).write_text(f'{{os.getpid()}} {{child.pid}}')\n"
            "signal.pause()  # stalls until the unpack timeout kills it\n"
        )
        monkeypatch.setattr(packages, "UNPACK_SOURCE", stall)
        self.data = archive({"train.py": b""})
        server = Server(self.data)
        server.go.set()
        self.tools = find_tools(False, False)
        self.cache = PackageCache(tmp_path / "packages", server.fetch, self.tools.python)
        self.scratch = tmp_path / "j1"
        self.scratch.mkdir()

    async def unpack(self, timeout_s: float) -> Path:
        unpacker = Unpacker(self.tools, timeout_s=timeout_s)
        return await self.cache.unpack_into(
            package_of(self.data), self.scratch, None, "j1", unpacker
        )

    def pids(self) -> list[int]:
        with contextlib.suppress(FileNotFoundError):
            return [int(pid) for pid in self.started.read_text().split()]
        return []

    async def all_gone(self) -> None:
        pids = self.pids()
        assert len(pids) == 2, pids
        for pid in pids:
            await eventually(lambda pid=pid: gone(pid), 10, f"process {pid} to be killed")


async def test_an_unpacker_past_its_timeout_is_stopped_with_its_process_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a cgroup (as without root) the timeout still holds: the unpacker and what it
    started are killed, and the pod fails for good, saying why."""
    stalled = Stalled(tmp_path, monkeypatch)
    why = r"^PackageRefused: package \w+: unpacking took more than 3 s: stopped$"
    with pytest.raises(StartError, match=why):
        await stalled.unpack(timeout_s=3)
    await stalled.all_gone()
    assert not (stalled.scratch / "work").exists()


async def test_an_unpacker_whose_pod_is_stopped_meanwhile_is_stopped_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stalled = Stalled(tmp_path, monkeypatch)
    unpacking = asyncio.create_task(stalled.unpack(timeout_s=600))
    await eventually(lambda: len(stalled.pids()) == 2, 30, "the unpacker to start")
    unpacking.cancel()  # as the supervisor's task is when the pod is stopped while it starts
    with contextlib.suppress(asyncio.CancelledError):
        await unpacking
    await stalled.all_gone()
