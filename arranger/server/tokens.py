"""tokens: who a bearer token names, asked of the store once and kept, and revocations noticed.

The server keeps each token the store confirmed (by its SHA-256) until it is revoked or unused
for TOKEN_CACHE_S; every REVOCATION_CHECK_S the tokens in use (cached, or holding a stream open)
are checked against the store: a revoked one is forgotten and every stream it opened ends.
Tokens still issued have their last use written, at most every TOKEN_USE_WRITE_S.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from arranger.identity import Principal, Role
from arranger.security import TOKEN_PREFIX, OpenStreams, token_hash
from arranger.server.store import Store

log = structlog.get_logger()

TOKEN_CACHE_S = 300.0  # how long a token the store confirmed is kept without being used
REVOCATION_CHECK_S = 1.0  # how often the tokens in use are checked against the store
TOKEN_USE_WRITE_S = 60.0  # how often a token in use has its last_used written


class Tokens:
    """Tokens identifies callers by token for one server (see the module's docstring)."""

    def __init__(
        self, store: Callable[[], Store | None], streams: OpenStreams, clock: Callable[[], float]
    ) -> None:
        self._store = store  # the server's store, once it is open
        self.streams = streams
        self.clock = clock  # the server's clock: when a token was last used
        self._known: dict[str, tuple[Principal, float]] = {}  # hash -> its principal, until
        self._uses: dict[str, float] = {}  # hash -> when its last_used was last written
        self._granted: dict[str, Principal] = {}  # hash -> principal: tokens kept in memory only

    def grant(self, token: str, principal: Principal) -> None:
        """grant makes `token` name `principal` for this server's life, without the store (a
        dev cluster's owner: a login that no earlier or later run of it accepts)."""
        digest = token_hash(token)
        self._granted[digest] = Principal(principal.user, principal.role, token=digest)

    def cached(self, token: str) -> Principal | None:
        """cached: the principal of a token known without asking the store (granted, or
        confirmed by the store lately); None otherwise."""
        if not token.startswith(TOKEN_PREFIX):
            return None
        digest = token_hash(token)
        known = self._known.get(digest)
        return self._granted.get(digest) or (
            known[0] if known and known[1] > time.monotonic() else None
        )

    async def identify(self, token: str) -> Principal | None:
        """identify: the principal a bearer token names, None if it was never issued or is
        revoked. The store is asked once; the answer is kept until the token is revoked (the
        revocation check notices within REVOCATION_CHECK_S) or unused for TOKEN_CACHE_S."""
        if not token.startswith(TOKEN_PREFIX):
            return None
        digest = token_hash(token)
        if digest in self._granted:
            return self._granted[digest]
        now = time.monotonic()
        cached = self._known.get(digest)
        if cached is not None and cached[1] > now:
            self._known[digest] = (cached[0], now + TOKEN_CACHE_S)
            return cached[0]
        store = self._store()
        found = await store.token_owner(digest) if store is not None else None
        if found is None:
            self._known.pop(digest, None)
            return None
        user, role = found
        principal = Principal(user, Role(role), token=digest)
        self._known[digest] = (principal, now + TOKEN_CACHE_S)
        return principal

    async def watch_revocations(self) -> None:
        """watch_revocations checks the tokens in use against the store, for good."""
        while True:
            await asyncio.sleep(REVOCATION_CHECK_S)
            try:
                await self._check()
            except Exception:
                log.exception("cannot check tokens for revocation")

    async def _check(self) -> None:
        store = self._store()
        now = time.monotonic()
        self._known = {d: v for d, v in self._known.items() if v[1] > now}
        in_use = (set(self._known) | set(self.streams.tokens())) - set(self._granted)
        if store is None or not in_use:
            return
        stale = {
            d for d in in_use if d not in self._uses or self._uses[d] + TOKEN_USE_WRITE_S < now
        }
        revoked = await store.tokens_revoked(in_use, self.clock(), stale)
        for digest in stale - revoked:
            self._uses[digest] = now
        for digest in revoked:
            self._known.pop(digest, None)
            self._uses.pop(digest, None)
            self.streams.revoke(digest)
            log.info("token revoked: its streams end", token=digest[:12])
