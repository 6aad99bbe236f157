"""login_throttle: how fast one client may guess tokens at the dashboard's login.

Each client has a bucket of TRIES tries; a wrong token takes one, and one comes back every
REFILL_S seconds. While its bucket is empty every try of that client is refused before its
token is looked at, right or wrong, so guessing runs at one token per REFILL_S at most; a right
token takes nothing, so a user who logs in again and again is never refused.

A client is its address, an IPv6 one by its /64 (which one host is given whole, and could
otherwise walk through). Behind a proxy every client is the proxy: its users share one bucket.
At most MAX_CLIENTS buckets are kept, the one changed longest ago let go first; a bucket that
has filled up again is let go too (a full bucket is what a client without one has). Times are
the server's clock, which tests move.
"""

from __future__ import annotations

import ipaddress
import math
from collections import OrderedDict
from collections.abc import Callable

TRIES = 10
REFILL_S = 6.0
MAX_CLIENTS = 10_000


class LoginThrottle:
    """LoginThrottle: each client's bucket, as (tries left, when that was so), a fraction of a
    try counted while it refills; only buckets short of TRIES are kept."""

    def __init__(
        self, clock: Callable[[], float], tries: int = TRIES, refill_s: float = REFILL_S
    ) -> None:
        self._clock = clock
        self._tries = tries
        self._refill_s = refill_s
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def wait_s(self, address: str) -> int:
        """wait_s: 0 when the client at `address` may try now, else the whole seconds until
        it may (at least 1)."""
        left = self._left(client(address))
        return 0 if left >= 1 else max(1, math.ceil((1 - left) * self._refill_s))

    def failed(self, address: str) -> None:
        """failed takes a try from the client at `address`: it gave a wrong token."""
        key = client(address)
        self._buckets[key] = (max(0.0, self._left(key) - 1), self._clock())
        self._buckets.move_to_end(key)
        while len(self._buckets) > MAX_CLIENTS:
            self._buckets.popitem(last=False)

    def _left(self, key: str) -> float:
        """_left: the tries `key` has now (TRIES for a client without a bucket)."""
        bucket = self._buckets.get(key)
        if bucket is None:
            return float(self._tries)
        left, since = bucket
        left += max(0.0, self._clock() - since) / self._refill_s
        if left >= self._tries:
            del self._buckets[key]
            return float(self._tries)
        return left


def client(address: str) -> str:
    """client: the key of the client at `address`: the address, or an IPv6 one's /64."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:  # no address (a Unix socket) or not one: all such share a bucket
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:  # ::ffff:1.2.3.4 is 1.2.3.4
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)
