"""clock: the server's time, which the wall clock's steps cannot move.

Every timeout, back-off, lease and liveness check of the server is measured on one clock: the
wall time when the server started, advanced by the monotonic clock since. It reads like wall
time (it is written in records and shown to users) but an NTP step or an operator's `date -s`
while the server runs changes no decision: a node is not lost because the wall clock jumped
forward, and a back-off does not stretch because it jumped back. A restarted server anchors it
on the wall clock again, as it must to read the times its store holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class SteadyClock:
    """SteadyClock: `wall()` read once, at construction; `monotonic()` ever after."""

    def __init__(
        self,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._monotonic = monotonic
        self._offset = wall() - monotonic()

    def __call__(self) -> float:
        return self._offset + self._monotonic()
