"""package_quota: how many bytes of packages one user may keep in the store, the server's
`limits.storedPackageBytesPerUser`.

What a user keeps is the size of every package they own (Store.package_bytes): one that other
users uploaded too counts in full for each of them, so that no one learns from their usage
that someone else holds it. Their uploads under way count too, each for the size it announced,
from its first message until it ends, so that uploads sent at once cannot pass the limit
together. Uploading a package one owns already costs nothing. Admins are counted like everyone:
the store's disk is everyone's.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from arranger.server.store import Store

LIMIT = "limits.storedPackageBytesPerUser"


@dataclass
class PackageQuota:
    """PackageQuota: `limit_bytes` per user, over the store `store_of()` gives."""

    limit_bytes: int
    store_of: Callable[[], Store]
    _uploading: dict[str, int] = field(default_factory=dict)  # user -> bytes under way

    @contextlib.asynccontextmanager
    async def holding(self, user: str, sha256: str, size: int) -> AsyncIterator[str]:
        """holding counts `size` bytes more of `user`'s while the block runs (their upload of
        the package `sha256`), and yields why that passes the limit, naming it and what the
        user keeps ("" if it does not: the upload may go on)."""
        store = self.store_of()
        if await store.package_size(sha256, user) is not None:
            yield ""
            return
        # Counted before the store is asked, so that an upload that begins meanwhile counts
        # this one: two may both be refused, never both let through past the limit.
        self._uploading[user] = self._uploading.get(user, 0) + size
        try:
            kept = await store.package_bytes(user)
            under_way = self._uploading[user] - size
            yield self._problem(user, kept, under_way, size)
        finally:
            left = self._uploading[user] - size
            if left:
                self._uploading[user] = left
            else:
                del self._uploading[user]

    def _problem(self, user: str, kept: int, under_way: int, size: int) -> str:
        if kept + under_way + size <= self.limit_bytes:
            return ""
        uploading = f" and uploads {under_way} more" if under_way else ""
        return (
            f"{LIMIT}: user {user!r} keeps {kept} bytes of packages{uploading}; this one's {size} "
            f"bytes would pass the limit of {self.limit_bytes}; delete ended jobs whose working "
            "directories are no longer needed (a package no job names is dropped a day after "
            "it was last uploaded or asked for)"
        )
