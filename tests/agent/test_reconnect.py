"""The agent's reconnect back-off: jittered, so agents cut off at once come back spread out."""

from __future__ import annotations

import random

from arranger.agent.servers import reconnect_delay


def test_each_wait_is_between_half_the_back_off_and_all_of_it() -> None:
    rng = random.Random(7)
    waits = [reconnect_delay(4.0, rng) for _ in range(1_000)]
    assert all(2.0 <= wait <= 4.0 for wait in waits)
    assert max(waits) - min(waits) > 1.5  # spread over the range, not one value
