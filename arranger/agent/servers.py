"""servers: the servers an agent may talk to, in turn, and how long it waits between rounds.

The servers share the cluster's store, one of them active: the agent moves on to the next
whenever a session ends (unreachable, a standby, a server that lost its lease), and waits out
its back-off only after trying each. The back-off starts at RECONNECT_FIRST_S, doubles after
every round up to the configured reconnect_max_s (STANDBY_RETRY_S while a standby answered: it
takes over within a term), and starts over after a session that lasted RECONNECT_RESET_S.
"""

from __future__ import annotations

import random

RECONNECT_FIRST_S = 0.1  # the back-off after a session ends; it doubles up to reconnect_max_s
RECONNECT_RESET_S = 30.0  # a session that lasted this long starts the back-off over
STANDBY_SAYS = "the active server is"  # in a standby's refusal (see the server's leadership)
STANDBY_RETRY_S = 1.0  # the back-off's cap while a standby answers: it takes over within a term
_RANDOM = random.Random()  # jitter draws leave the global generator's sequence alone


def reconnect_delay(backoff_s: float, rng: random.Random | None = None) -> float:
    """reconnect_delay is the wait before the next attempt to reach the server: between half
    of `backoff_s` and all of it, at random, so that agents cut off at once (a server restart)
    come back spread over the back-off, not all in the same instant at every attempt."""
    return backoff_s * (rng or _RANDOM).uniform(0.5, 1.0)


class Servers:
    """Servers: the servers named in `listed` (comma-separated), the one tried now first."""

    def __init__(self, listed: str, reconnect_max_s: float) -> None:
        self.all = [s.strip() for s in listed.split(",") if s.strip()]
        self.reconnect_max_s = reconnect_max_s
        self.index = 0
        self.backoff_s = RECONNECT_FIRST_S
        self._standby_seen = False  # a standby refused in this round: a takeover is near

    @property
    def current(self) -> str:
        """current: the server the agent talks to, or tries next."""
        return self.all[self.index]

    def refused(self, details: str) -> None:
        """refused notes the current server's refusal (`details`: what it said)."""
        self._standby_seen |= STANDBY_SAYS in details

    def next(self, lasted_s: float) -> float:
        """next moves on to the next server once a session that lasted `lasted_s` ended, and
        says how long to wait before trying it: nothing within a round, the back-off (see
        reconnect_delay) once each server was tried."""
        if lasted_s > RECONNECT_RESET_S:
            self.backoff_s = RECONNECT_FIRST_S
        self.index = (self.index + 1) % len(self.all)
        if self.index != 0:
            return 0.0
        delay = reconnect_delay(self.backoff_s)
        most = STANDBY_RETRY_S if self._standby_seen else self.reconnect_max_s
        self.backoff_s = min(self.backoff_s * 2, most)
        self._standby_seen = False
        return delay
