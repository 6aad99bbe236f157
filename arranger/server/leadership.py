"""leadership: which of the servers sharing a store is the active one, by the store's lease.

A server takes the lease when it lapses (by the database's clock) and renews it every third of
its term; taking it raises the epoch, which fences the store's writes (see Store) and is sent
to every agent, which obeys no server of an older epoch. On a store that is not shared the
lease is this server's at once and for good.

The server also keeps its own, more careful, count: the lease holds, as far as this server
may act on it, until a term after the last renewal it *sent* (measured on the boot-time
clock, which neither SIGSTOP nor a suspended machine or paused VM skips), less a margin for
clock drift. Past that it orders
nothing, even if the database has not yet noticed; a renewal that says another server took
the lease, or that fails until that point, ends its leadership: it steps down.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Awaitable, Callable

import structlog

from arranger.server.store import Lease, Store, StoreError, Unreachable

log = structlog.get_logger()

DRIFT = 0.9  # the share of a term this server trusts its own clock for


class Leadership:
    """Leadership holds this server's lease on its store (see the module's docstring)."""

    def __init__(
        self,
        store: Store,
        holder: str,
        term_s: float,
        clock: Callable[[], float] = lambda: time.clock_gettime(time.CLOCK_BOOTTIME),
    ) -> None:
        self.store = store
        self.holder = holder  # where clients and agents reach this server
        self.term_s = term_s
        self.clock = clock
        self.active = ""  # where the active server is, as the lease last said ("": unknown)
        self.lost = asyncio.Event()  # set once this server stepped down
        self.reason = ""  # why it stepped down
        self._until = -math.inf  # this server may act on the lease until then (its clock)
        self._renew_error = ""  # why the last renewal failed
        self.renewals = 0  # renewals that came back in time

    @property
    def epoch(self) -> int:
        """epoch: the lease's epoch this server holds (fences its writes and orders)."""
        assert self.store.epoch is not None, "the lease is not taken"
        return self.store.epoch

    def remaining_s(self) -> float | None:
        """remaining_s: how long this server may still act on the lease without renewing it
        (0 once lost; None where the store is not shared, and the lease never lapses)."""
        if self._until == math.inf:
            return None
        return max(0.0, self._until - self.clock()) if not self.lost.is_set() else 0.0

    def holds(self) -> bool:
        """holds: this server holds the lease and may order agents about now."""
        return not self.lost.is_set() and self.clock() < self._until

    async def take(self) -> None:
        """take waits until this server holds the lease (a standby meanwhile, knowing which
        server is active)."""
        while True:
            sent = self.clock()
            try:
                lease = await self.store.take_lease(self.holder, self.term_s)
            except StoreError as exc:
                log.warning("cannot reach the store for its lease", error=str(exc))
                await asyncio.sleep(self.term_s / 3)
                continue
            if self.store.epoch is not None and lease.epoch == self.store.epoch:
                self._held(sent, lease)
                self.active = self.holder
                if self.store.shared:
                    log.info("this server is active", epoch=lease.epoch, holder=self.holder)
                return
            if lease.holder != self.active:
                log.info(
                    "standby: another server is active",
                    active=lease.holder,
                    epoch=lease.epoch,
                    lapses_in_s=round(lease.remaining_s, 1),
                )
            self.active = lease.holder
            await asyncio.sleep(min(self.term_s / 3, max(lease.remaining_s, 0.05)))

    async def keep(self) -> None:
        """keep renews the lease until this server loses it or stops; when it loses it,
        `lost` is set (and the reason said). Renewals run in a thread of their own, so that a
        busy event loop (a large store loading, a long cycle being applied) never delays them;
        this task only watches the term run out, so that a renewal that hangs (a network that
        drops everything) cannot keep a server active past it."""
        if not self.store.shared:
            return
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        thread = threading.Thread(target=self._renew, args=(loop, stop), name="lease", daemon=True)
        thread.start()
        try:
            while not self.lost.is_set():
                await asyncio.sleep(min(0.25, self.term_s / 10))
                if not self.holds():
                    why = self._renew_error or "no answer from the store"
                    self.lose(f"the lease could not be renewed before it lapsed: {why}")
        finally:
            stop.set()

    def _renew(self, loop: asyncio.AbstractEventLoop, stop: threading.Event) -> None:
        """_renew (the lease's thread) renews every third of a term until `stop`."""
        while not stop.wait(self.term_s / 3):
            sent = self.clock()
            try:
                lease = self.store.renew_lease_now(self.term_s)
            except StoreError as exc:
                self._renew_error = str(exc)
                log.warning("cannot renew the lease yet", error=str(exc))
                continue
            if lease is None:
                _tell(loop, self.lose, "another server took the lease")
                return
            if self.clock() >= self._until:  # back after this server stopped trusting it
                _tell(loop, self.lose, "the lease lapsed before it was renewed")
                with contextlib.suppress(StoreError):  # renewed all the same: let it go now
                    self.store.renew_lease_now(0.0)
                return
            self._renew_error = ""
            self._held(sent, lease)
            self.renewals += 1

    def _held(self, sent: float, lease: Lease) -> None:
        if not self.store.shared:
            self._until = math.inf  # no other server may take it
            return
        self._until = sent + DRIFT * min(self.term_s, lease.remaining_s)

    def lose(self, reason: str) -> None:
        """lose: this server is no longer active (another took the lease, a write was fenced,
        the term ran out): it orders nothing more and steps down."""
        if self.lost.is_set():
            return
        self.reason = f"this server stepped down: {reason}"
        self._until = -math.inf
        log.error(
            "stepping down: this server is no longer active", reason=reason, epoch=self.store.epoch
        )
        self.lost.set()

    async def release(self) -> None:
        """release lets go of the lease while this server holds it: a standby need not wait
        for it to lapse (if the store cannot be told, it takes over when the lease lapses)."""
        if not self.holds():
            return
        try:
            await self.store.release_lease()
        except StoreError as exc:
            log.warning(
                "the lease was not let go: a standby takes over when it lapses", error=str(exc)
            )

    def standby_reason(self) -> str:
        """standby_reason: why this server is not serving yet (or any more), naming the
        active server where it is known; "" once it holds the lease."""
        if self.lost.is_set():
            return f"{self.reason}; the active server is {self.active or 'being elected'}"
        if self.store.epoch is not None:
            return ""
        if self.active and self.active != self.holder:
            return f"this server is a standby; the active server is {self.active}"
        return "this server is starting; the active server is being elected"


def _tell(loop: asyncio.AbstractEventLoop, call: Callable[[str], None], reason: str) -> None:
    """_tell runs `call(reason)` on the loop, from the lease's thread (unless it has closed)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(call, reason)


STORE_RETRY_MAX_S = 10.0  # the longest wait between tries to reach a shared store


async def open_when_reachable(
    open_store: Callable[[], Awaitable[Store]], away: Callable[[str], None]
) -> Store:
    """open_when_reachable opens a shared store, trying again while its database server
    cannot be reached (1 s, doubling to STORE_RETRY_MAX_S), telling `away` why meanwhile (""
    once it is open): a server whose PostgreSQL went away stays up, a standby, and takes the
    lease back when it can."""
    delay = 1.0
    while True:
        try:
            store = await open_store()
        except Unreachable as exc:
            away(str(exc))
            log.warning(
                "the store is unreachable: waiting as a standby", error=str(exc), retry_s=delay
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, STORE_RETRY_MAX_S)
            continue
        away("")
        return store


def refusal(leadership: Leadership | None, serving: bool, store_away: str) -> str:
    """refusal: why a server refuses calls now ("" while it is active and loaded, and may
    still act on its lease): starting, waiting for its store (`store_away` says why), a
    standby, or loading its store."""
    if serving and leadership is not None and leadership.holds():
        return ""
    if store_away:
        return f"this server waits, a standby, for its store: {store_away}"
    if leadership is None:
        return "this server is starting"
    return leadership.standby_reason() or "this server is loading its store"
