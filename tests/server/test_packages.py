"""Packages in the store (both backends): kept in rows of a MiB, stored once, and pruned with
the last job that names them (or a day after an upload no job named)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from arranger.client.package import PACKAGE_GONE, ship, submit_shipping
from arranger.client.sdk import ArrangerError, AsyncClient
from arranger.server import packages
from arranger.server.app import ArrangerServer
from arranger.server.packages import AVERAGE_CHUNK_BYTES, GONE, MAX_UPLOADS_PER_USER
from arranger.server.store import open_store
from arranger.server.store.base import PACKAGE_CHUNK_BYTES
from arranger.v1 import arranger_pb2, job_pb2
from tests.conftest import FAST, bare_server, eventually, job_spec

DAY = 86_400.0


async def test_a_package_is_stored_in_rows_and_read_back_whole(
    tmp_path: Path, store_url: str
) -> None:
    data = os.urandom(2 * PACKAGE_CHUNK_BYTES + 123)
    sha256 = hashlib.sha256(data).hexdigest()
    path = tmp_path / "p.tar.gz"
    path.write_bytes(data)
    store = await open_store(store_url, create=True)
    try:
        assert await store.package_size(sha256) is None
        assert await store.put_package(sha256, len(data), 1.0, path, "alice")
        assert await store.package_size(sha256) == len(data)
        rows = [chunk async for chunk in store.package_chunks(sha256, len(data))]
        assert [len(r) for r in rows] == [PACKAGE_CHUNK_BYTES, PACKAGE_CHUNK_BYTES, 123]
        assert b"".join(rows) == data
        assert not await store.put_package(sha256, len(data), 2.0, path, "alice")  # held
    finally:
        await store.close()


async def test_prune_removes_packages_no_kept_job_names(tmp_path: Path, store_url: str) -> None:
    now = [1_800_000_000.0]
    config = dataclasses.replace(
        FAST, listen="127.0.0.1:0", data_dir=tmp_path / "server", store=store_url
    )
    server = ArrangerServer(config, clock=lambda: now[0])
    await server.start()
    trees = {}
    for name in ("old", "young", "unused", "fresh"):
        top = tmp_path / name
        top.mkdir()
        (top / "train.py").write_text(f"print({name!r})\n")
        trees[name] = top
    try:
        async with AsyncClient(f"127.0.0.1:{server.port}", timeout_s=10) as client:
            shipped = {name: (await ship(client, top)).package for name, top in trees.items()}
            for name in ("old", "young"):
                job = job_spec(name, ["true"])
                await client.submit(job, trees[name])
                await client.stop(name)
                now[0] += 20 * DAY
            now[0] += 11 * DAY - 2 * DAY  # old finished 31 days ago, young 11
            await ship(client, trees["fresh"])  # uploaded again: still within its day
            assert await server.prune() == 1

            async def held(name: str) -> bool:
                return (await client.has_package(shipped[name].sha256)).present

            assert not await held("old")  # its job is gone
            assert await held("young")  # its job is kept, however old the upload
            assert not await held("unused")  # uploaded 40 days ago, named by no job
            assert await held("fresh")
            now[0] += 2 * DAY
            await server.prune()
            assert not await held("fresh")
    finally:
        await server.stop()


async def test_a_user_has_at_most_a_few_uploads_under_way(tmp_path: Path) -> None:
    held = asyncio.Event()
    announced = job_pb2.Package(sha256="0" * 64, size=10)

    async def hanging() -> AsyncIterator[arranger_pb2.UploadPackageRequest]:
        yield arranger_pb2.UploadPackageRequest(package=announced, data=b"x")
        await held.wait()

    top = tmp_path / "proj"
    top.mkdir()
    (top / "train.py").write_text("")
    async with (
        bare_server(tmp_path / "server") as server,
        AsyncClient(f"127.0.0.1:{server.port}", timeout_s=10) as client,
    ):
        hung = [
            asyncio.ensure_future(client.upload_package(hanging))
            for _ in range(MAX_UPLOADS_PER_USER)
        ]

        async def full() -> bool:  # every hung upload is under way (HasPackage says so)
            try:
                await client.has_package("1" * 64)
            except ArrangerError as exc:
                return exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            return False

        await eventually(full, what="the uploads to be under way")

        async def refused() -> str:
            try:
                await ship(client, top)
            except ArrangerError as exc:
                assert exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED
                return exc.message
            (top / "train.py").write_text(str(os.urandom(8)))  # another package
            return ""

        message = await eventually(refused, what="an upload over the limit to be refused")
        assert message.startswith("uploads: user ")
        assert f"has {MAX_UPLOADS_PER_USER} package uploads under way" in message
        for call in hung:
            call.cancel()
        await asyncio.gather(*hung, return_exceptions=True)
        await eventually(lambda: _shipped(client, top), what="uploads to be taken again")


async def test_a_flood_of_tiny_messages_is_refused(tmp_path: Path) -> None:
    announced = job_pb2.Package(sha256="0" * 64, size=3 * AVERAGE_CHUNK_BYTES)

    async def flood() -> AsyncIterator[arranger_pb2.UploadPackageRequest]:
        yield arranger_pb2.UploadPackageRequest(package=announced)
        for _ in range(1000):
            yield arranger_pb2.UploadPackageRequest(data=b"")

    async with (
        bare_server(tmp_path / "server") as server,
        AsyncClient(f"127.0.0.1:{server.port}", timeout_s=10) as client,
    ):
        with pytest.raises(ArrangerError) as refused:
            await client.upload_package(flood)
        assert "more than 5 messages for 12288 bytes" in refused.value.message


async def _shipped(client: AsyncClient, top: Path) -> bool:
    try:
        await ship(client, top)
    except ArrangerError:
        return False
    return True


async def test_a_submit_that_finds_its_package_gone_ships_it_again(tmp_path: Path) -> None:
    assert GONE == PACKAGE_GONE  # the client knows the server's refusal by its start
    top = tmp_path / "proj"
    top.mkdir()
    (top / "train.py").write_text("")
    refusals = [ArrangerError(grpc.StatusCode.FAILED_PRECONDITION, f"{GONE} package x; upload")]
    said: list[bool] = []
    async with (
        bare_server(tmp_path / "server") as server,
        AsyncClient(f"127.0.0.1:{server.port}", timeout_s=10) as client,
    ):

        async def submit(job: job_pb2.TYJob) -> job_pb2.TYJob:
            if refusals:
                raise refusals.pop()
            return job

        job = job_pb2.TYJob()
        sent = await submit_shipping(client, job, top, submit, lambda s: said.append(s.uploaded))
        assert said == [True, False]  # shipped again (the server still held it here)
        assert sent.spec.package.sha256 and not refusals


async def test_a_stalled_upload_is_dropped_and_frees_its_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(packages, "UPLOAD_IDLE_S", 0.3)
    never = asyncio.Event()
    announced = job_pb2.Package(sha256="1" * 64, size=10)

    async def stalls() -> AsyncIterator[arranger_pb2.UploadPackageRequest]:
        yield arranger_pb2.UploadPackageRequest(package=announced, data=b"x")
        await never.wait()  # a client that stops sending, its stream still open

    async with (
        bare_server(tmp_path / "server") as server,
        AsyncClient(f"127.0.0.1:{server.port}", timeout_s=30) as client,
    ):
        stalled = [client.upload_package(stalls) for _ in range(MAX_UPLOADS_PER_USER)]
        results = await asyncio.gather(*stalled, return_exceptions=True)
        for result in results:
            assert isinstance(result, ArrangerError), result
            assert result.code == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "nothing arrived for 0.3 s" in result.message
        top = tmp_path / "proj"
        top.mkdir()
        (top / "train.py").write_text("print('hello')\n")
        assert (await ship(client, top)).uploaded  # every slot was freed
