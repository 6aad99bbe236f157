"""A store removed under a running server: the next write notices, every change after it is
refused with UNAVAILABLE naming the problem, nothing is ordered to agents, and the agents keep
their streams (so no pod is fenced) and their pods."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from arranger.client.sdk import ArrangerError, AsyncClient
from arranger.server.store import store_path
from tests.conftest import Gate, job_spec, running_cluster


async def test_a_removed_store_refuses_writes_and_kills_nothing(tmp_path: Path, gate: Gate) -> None:
    async with (
        running_cluster(tmp_path / "c") as cluster,
        AsyncClient(cluster.address, timeout_s=10) as client,
    ):
        await client.submit(job_spec("kept", gate.command(tmp_path), workers=2))
        running = await client.wait("kept", stages=["Running"], timeout_s=30)
        pids = [p.pid for p in [running.status.leader, *running.status.workers]]
        db = store_path(cluster.server.config.store_url)
        assert db is not None
        for path in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
            path.unlink(missing_ok=True)

        for call in (client.submit(job_spec("lost", ["true"])), client.stop("kept")):
            with pytest.raises(ArrangerError) as refused:
                await call
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE
            assert f"the store file {db} was removed or replaced" in refused.value.message
        with pytest.raises(ArrangerError) as refused:  # it stays refused
            await client.submit(job_spec("lost-again", ["true"]))
        assert "removed or replaced" in refused.value.message

        now = await client.get("kept")
        assert now.status.stage == "Running" and not now.spec.terminating
        assert [p.pid for p in [now.status.leader, *now.status.workers]] == pids
        assert all(agent.connected.is_set() for agent in cluster.agents)
        assert all(node.connected for node in cluster.server.controller.nodes.values())
        gate.open()
