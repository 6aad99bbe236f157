"""The collector freezes what survives a full collection and unfreezes it after its period."""

from __future__ import annotations

import gc

from arranger.server.collector import Collector


class Record:
    """Record: a long-lived object the collector tracks."""


def test_survivors_of_a_full_collection_are_frozen_then_unfrozen_after_the_period() -> None:
    collector = Collector(full_every_s=3_600.0)
    collector.install()
    try:
        kept = [Record() for _ in range(1_000)]
        gc.collect()
        frozen = gc.get_freeze_count()
        assert frozen >= len(kept)  # the survivors are out of later collections
        collector.full_every_s = 0.0  # the period has passed: the next full one unfreezes
        gc.collect()
        assert gc.get_freeze_count() == 0
    finally:
        collector.remove()
    assert collector._hook not in gc.callbacks and gc.get_freeze_count() == 0
    del kept
