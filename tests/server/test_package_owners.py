"""Packages belong to the users who uploaded them, on both store backends: a package's hash is
no capability. Another user's HasPackage learns nothing of it, a job of theirs may not name it,
and uploading the same content makes it theirs too without telling them anyone else had it;
logs name a package by a prefix of its hash only."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from structlog.testing import capture_logs

from arranger.client.package import ship
from arranger.client.sdk import ArrangerError, AsyncClient
from arranger.security import new_token, token_hash
from arranger.server.effects import Pruning
from arranger.server.store import Batch, open_store
from arranger.v1 import arranger_pb2, job_pb2
from tests.conftest import job_spec
from tests.server.test_auth import Secured, secured

USERS = (("alice", "user"), ("bob", "user"), ("root", "admin"))


@contextlib.asynccontextmanager
async def users_on(
    tmp_path: Path, store_url: str, **changes: Any
) -> AsyncIterator[tuple[Secured, dict[str, AsyncClient]]]:
    """users_on: a TLS server on the store at `store_url` (with `changes` to its config) and a
    client for each of USERS, holding a token issued in that store."""
    async with secured(tmp_path, store=store_url, **changes) as cluster:
        assert cluster.server is not None
        clients: dict[str, AsyncClient] = {}
        async with contextlib.AsyncExitStack() as stack:
            for user, role in USERS:
                token = new_token()
                await cluster.server.store.add_token(
                    user, user, role, token_hash(token), time.time()
                )
                client = AsyncClient(
                    cluster.address, ca=cluster.tls / "ca.pem", token=token, timeout_s=10
                )
                clients[user] = await stack.enter_async_context(client)
            yield cluster, clients


async def refusal(call: Any) -> ArrangerError:
    with pytest.raises(ArrangerError) as refused:
        await call
    return refused.value


async def upload(client: AsyncClient, data: bytes) -> arranger_pb2.UploadPackageResponse:
    """upload sends `data` as a package in one message."""
    package = job_pb2.Package(sha256=hashlib.sha256(data).hexdigest(), size=len(data))

    async def messages() -> AsyncIterator[arranger_pb2.UploadPackageRequest]:
        yield arranger_pb2.UploadPackageRequest(package=package, data=data)

    return await client.upload_package(messages)


async def test_a_package_is_read_only_by_jobs_of_the_users_who_uploaded_it(
    tmp_path: Path, store_url: str
) -> None:
    top = tmp_path / "proj"
    top.mkdir()
    (top / "secret.py").write_text("KEY = 'alice only'\n")
    with capture_logs() as logs:
        async with users_on(tmp_path, store_url) as (_, it):
            sha256 = await shared_by_alice_then_bob(it, top)
    assert sha256 not in json.dumps(logs, default=str)  # the whole hash is its owners' ...
    stored = [(e["user"], e["sha256"]) for e in logs if e["event"] == "package stored"]
    assert stored == [("alice", sha256[:12]), ("bob", sha256[:12])]  # ... a prefix names it


async def shared_by_alice_then_bob(it: dict[str, AsyncClient], top: Path) -> str:
    """shared_by_alice_then_bob: alice ships `top`; bob, who cannot use it, ships it too; the
    package's hash."""
    alice, bob, root = it["alice"], it["bob"], it["root"]
    shipped = await ship(alice, top)
    assert shipped.uploaded
    sha256 = shipped.package.sha256
    assert (await alice.has_package(sha256)).present
    # A guess (or a hash read somewhere) confirms nothing to another user ...
    assert not (await bob.has_package(sha256)).present
    assert (await root.has_package(sha256)).present  # admins read every package
    # ... and a job of theirs may not name it.
    stolen = job_spec("stolen", [sys.executable, "secret.py"])
    stolen["spec"]["package"] = {"sha256": sha256, "size": shipped.package.size}
    refused = await refusal(bob.submit(stolen))
    assert refused.code == grpc.StatusCode.FAILED_PRECONDITION
    assert (
        refused.message
        == (  # naming the field, and nothing of the package
            f"spec.package: the server does not hold package {sha256[:12]} for user 'bob'; "
            "upload it first (arranger submit and the SDK's submit do)"
        )
    )
    await root.submit(job_spec("audit", ["true"], package=stolen["spec"]["package"]))
    # Bob packs the same tree: he sends it whole and is told it was uploaded, as if no one
    # had; then it is his as well, and his job may name it.
    again = await ship(bob, top)
    assert again.uploaded and again.package == shipped.package
    assert (await bob.has_package(sha256)).present
    await bob.submit(stolen)
    assert not (await ship(bob, top)).uploaded  # his now: not sent again
    return sha256


async def test_the_store_keeps_each_uploader_of_a_package(tmp_path: Path, store_url: str) -> None:
    data = os.urandom(1000)
    sha256 = hashlib.sha256(data).hexdigest()
    path = tmp_path / "p.tar"
    path.write_bytes(data)
    store = await open_store(store_url, create=True)
    try:
        assert await store.put_package(sha256, len(data), 1.0, path, "alice")
        assert await store.package_size(sha256) == 1000  # for an admin, or an agent's fetch
        assert await store.package_size(sha256, "alice") == 1000
        assert await store.package_size(sha256, "bob") is None
        assert not await store.touch_package(sha256, 2.0, "bob")
        assert await store.touch_package(sha256, 2.0, "alice")
        assert await store.put_package(sha256, len(data), 3.0, path, "bob")  # bob's now too
        assert not await store.put_package(sha256, len(data), 4.0, path, "bob")  # had it
        assert await store.package_size(sha256, "bob") == 1000
        assert [await store.package_bytes(u) for u in ("alice", "bob", "carol")] == [1000, 1000, 0]
        # Pruned, it is no one's.
        await store.write(Batch(pruned=Pruning(packages=(sha256,))))
        assert await store.package_size(sha256) is None
        assert [await store.package_bytes(u) for u in ("alice", "bob")] == [0, 0]
        assert await store.put_package(sha256, len(data), 5.0, path, "carol")
        assert await store.package_size(sha256, "alice") is None
    finally:
        await store.close()
