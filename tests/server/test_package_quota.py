"""Each user may keep only so many bytes of packages in the store (limits.
storedPackageBytesPerUser), on both store backends: what they own counts, and so do their
uploads under way; a package another user holds too counts for each of them."""

from __future__ import annotations

import os
from pathlib import Path

import grpc

from arranger.server.limits import UserLimits
from arranger.server.package_quota import PackageQuota
from arranger.server.store import open_store
from tests.server.test_package_owners import refusal, upload, users_on

SIZE = 10_000


async def test_a_user_keeps_at_most_their_quota_of_packages(tmp_path: Path, store_url: str) -> None:
    limits = UserLimits(stored_package_bytes_per_user=2 * SIZE + SIZE // 2)
    blobs = [os.urandom(SIZE) for _ in range(3)]
    async with users_on(tmp_path, store_url, limits=limits) as (_, it):
        alice, bob = it["alice"], it["bob"]
        for blob in blobs[:2]:
            assert (await upload(alice, blob)).stored
        refused = await refusal(upload(alice, blobs[2]))
        assert refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused.message.startswith(
            f"limits.storedPackageBytesPerUser: user 'alice' keeps {2 * SIZE} bytes of "
            f"packages; this one's {SIZE} bytes would pass the limit of {2 * SIZE + SIZE // 2}"
        ), refused.message
        assert not (await upload(alice, blobs[0])).stored  # hers already: it costs nothing
        # Bob's quota is his own; the package alice holds too counts for him in full.
        for blob in (blobs[2], blobs[0]):
            assert (await upload(bob, blob)).stored
        refused = await refusal(upload(bob, blobs[1]))
        assert refused.message.startswith("limits.storedPackageBytesPerUser: user 'bob' keeps ")


async def test_uploads_under_way_count_against_the_quota(tmp_path: Path, store_url: str) -> None:
    store = await open_store(store_url, create=True)
    path = tmp_path / "p"
    path.write_bytes(b"x" * 100)
    quota = PackageQuota(1000, lambda: store)

    async def refusal_of(user: str, sha256: str, size: int) -> str:
        async with quota.holding(user, sha256, size) as refused:
            return refused

    try:
        await store.put_package("a" * 64, 100, 1.0, path, "alice")
        async with quota.holding("alice", "b" * 64, 800) as held:  # 900 with what she keeps
            assert held == ""
            assert (await refusal_of("alice", "c" * 64, 101)).startswith(
                "limits.storedPackageBytesPerUser: user 'alice' keeps 100 bytes of packages "
                "and uploads 800 more; this one's 101 bytes would pass the limit of 1000"
            )
            assert await refusal_of("alice", "c" * 64, 100) == ""  # exactly the limit
            assert await refusal_of("alice", "a" * 64, 1000) == ""  # hers: costs nothing
            assert await refusal_of("bob", "c" * 64, 1000) == ""  # another user's quota
        assert await refusal_of("alice", "c" * 64, 900) == ""  # that upload ended
    finally:
        await store.close()


def test_the_quota_is_a_server_setting_with_a_default() -> None:
    assert UserLimits().stored_package_bytes_per_user == 4 * 2**30
    raw = {"storedPackageBytesPerUser": 2**30}
    assert UserLimits.from_mapping(raw).stored_package_bytes_per_user == 2**30
