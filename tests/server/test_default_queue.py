"""The `default` queue of a new cluster caps priority at the default priority (5), on both store
backends, so that a user cannot take the top priority and evict another user's gang; admins
are not asked. A cluster made before keeps its default queue as it was, and its server tells
the admin at every start how to cap it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import grpc
from structlog.testing import capture_logs

from arranger.server.app import ArrangerServer
from arranger.server.queues import DEFAULT
from arranger.server.store import Batch, open_store, rows
from arranger.spec import DEFAULT_PRIORITY
from tests.conftest import FAST, job_spec
from tests.server.test_package_owners import refusal, users_on
from tests.server.test_store_upgrade import PREVIOUS, copy_fixture, old_config

HINT = "arranger queue update default --max-priority 5"


async def test_a_new_clusters_default_queue_caps_users_priority(
    tmp_path: Path, store_url: str
) -> None:
    async with users_on(tmp_path, store_url) as (_, it):
        alice, root = it["alice"], it["root"]
        (default,) = [q for q in await alice.queues() if q.name == "default"]
        assert default.HasField("max_priority") and default.max_priority == DEFAULT_PRIORITY
        refused = await refusal(alice.submit(job_spec("top", ["true"], priority=10)))
        assert refused.code == grpc.StatusCode.PERMISSION_DENIED
        assert refused.message == (
            "spec.priority: 10 is above the maximum priority of queue 'default': 5"
        )
        await alice.submit(job_spec("usual", ["true"]))  # the default priority: allowed
        await root.submit(job_spec("urgent", ["true"], priority=10))  # admins are not asked
    store = await open_store(store_url)  # it is in the store, not only in memory
    try:
        assert [q for q in await store.load_queues() if q.name == "default"] == [DEFAULT]
    finally:
        await store.close()


async def test_an_existing_clusters_default_queue_is_kept_and_the_admin_told(
    tmp_path: Path, store_url: str
) -> None:
    """A store of the previous release (SQLite's fixture; a PostgreSQL store whose default
    queue has no cap, as every store made before has) keeps what it says: a migration never
    changes a cluster's policy behind its admin's back."""
    if store_url.startswith("sqlite"):
        config = old_config(copy_fixture(tmp_path, PREVIOUS))
    else:
        made = await open_store(store_url, create=True)
        uncapped = dataclasses.replace(DEFAULT, max_priority=None)
        await made.write(Batch(queues=[rows.queue_row(uncapped)]))
        await made.close()
        config = dataclasses.replace(FAST, listen="127.0.0.1:0", store=store_url)
    with capture_logs() as logs:
        server = ArrangerServer(config)
        await server.start()
        try:
            assert server.controller.queues["default"].max_priority is None
        finally:
            await server.stop()
    told = [e["event"] for e in logs if e["log_level"] == "warning" and HINT in e["event"]]
    assert len(told) == 1, [e["event"] for e in logs]
    assert told[0].startswith("queue 'default' has no maxPriority: any user may submit at ")
