"""The agent's package cache: one fetch per package however many pods wait for it, checked
against its hash, and unpacked by the pod's own account into the pod's directory."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from arranger.agent.config import PodUser
from arranger.agent.launcher import find_tools
from arranger.agent.packages import PackageCache
from arranger.agent.runtime import StartError
from arranger.v1 import job_pb2
from tests.agent.rootagent import local_users, needs_root, shared_dir


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


def package_of(data: bytes) -> job_pb2.Package:
    return job_pb2.Package(sha256=hashlib.sha256(data).hexdigest(), size=len(data))


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
