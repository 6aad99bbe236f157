"""The experiment row goes with its last member's, in every write that removes a job: its
deletion is looked up by the experiments of the removed jobs, through the partial index on
jobs.experiment, never by a scan of every job (SQLite's query plan says so)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from arranger.server.store.sqlite_transactions import ORPHAN_EXPERIMENT
from tests.conftest import bare_server


async def test_the_orphan_delete_uses_the_experiment_index(tmp_path: Path) -> None:
    async with bare_server(tmp_path):
        pass
    with sqlite3.connect(tmp_path / "arranger.db") as db:
        plan = " | ".join(
            row[-1] for row in db.execute(f"EXPLAIN QUERY PLAN {ORPHAN_EXPERIMENT}", ("e", "e"))
        )
    assert "SCAN jobs" not in plan, f"each experiment scans every job: {plan}"
