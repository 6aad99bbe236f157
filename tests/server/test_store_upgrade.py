"""A store written by an older arranger-server opens, migrates and serves with today's code.

The fixture (tests/fixtures/store-v4.db) was written at schema version 4; every migration since
must bring it forward without losing a job, a pod, a queue, a node or a token.
"""

from __future__ import annotations

import dataclasses
import shutil
import sqlite3
from pathlib import Path

import pytest

from arranger.security import token_hash
from arranger.server.app import ArrangerServer
from arranger.server.convert import spec_from_json
from arranger.server.store import HistoryQuery, StoreError
from arranger.server.store.sqlite import SqliteStore
from arranger.server.store.sqlite_schema import MIGRATIONS
from arranger.states import Stage
from tests.conftest import FAST

FIXTURE = Path(__file__).parent.parent / "fixtures" / "store-v4.db"
CENTURY_S = 36_500 * 86_400.0


def copy_fixture(tmp_path: Path) -> Path:
    data = tmp_path / "server"
    data.mkdir()
    shutil.copyfile(FIXTURE, data / "arranger.db")
    return data


async def test_a_version_4_store_is_migrated_and_keeps_everything(tmp_path: Path) -> None:
    data = copy_fixture(tmp_path)
    store = await SqliteStore.open(data / "arranger.db")
    try:
        jobs, nodes = await store.load(spec_from_json)
        queues = await store.load_queues()
        # A token issued before roles is a user token of the user its name says.
        assert await store.token_owner(token_hash("arr_fixture-token")) == ("ci", "user")
    finally:
        await store.close()
    by_name = {j.name: j for j in jobs}
    assert by_name["finished"].stage == Stage.SUCCEEDED
    assert by_name["finished"].spec.leader.env == {"WANDB_API_KEY": "secret-1"}
    assert by_name["waiting"].stage == Stage.PENDING
    assert all(len(j.pods) == 2 for j in jobs)
    templates = [
        t for j in jobs for t in (j.spec.leader, *(w.template for w in j.spec.worker_sets))
    ]
    assert {t.resources.pids for t in templates} == {0}  # stored before pids: the node's default
    assert all(j.owner == "" for j in jobs)  # submitted before owners: only admins change them
    assert sorted(n.name for n in nodes) == ["dev-0", "dev-1"]
    assert {q.name: q.weight for q in queues} == {"default": 1.0, "research": 2.0}
    # Queues from before policies let everyone submit at any priority, preemptible only.
    assert all(q.users == () and q.max_priority is None for q in queues)
    assert not any(q.allow_non_preemptible for q in queues)
    with sqlite3.connect(data / "arranger.db") as db:
        assert db.execute("PRAGMA user_version").fetchone() == (len(MIGRATIONS),)
        (cluster,) = db.execute("SELECT id FROM cluster").fetchone()
    assert len(cluster) == 32  # an upgraded store gets its cluster id


async def test_a_server_starts_on_a_version_4_store(tmp_path: Path) -> None:
    data = copy_fixture(tmp_path)
    # The fixture's times are those it was written at, older every day: "waiting" (it needs
    # more cpu than the cluster has) has been infeasible since then, and "finished" finished
    # then. Neither the infeasible timeout (the first cycle would fail "waiting" and record
    # it) nor retention (it would prune "finished") may pass while the test runs.
    config = dataclasses.replace(
        FAST, listen="127.0.0.1:0", data_dir=data,
        scheduler=dataclasses.replace(FAST.scheduler, infeasible_timeout_s=CENTURY_S),
        job_retention_s=CENTURY_S, history_retention_s=CENTURY_S,
    )  # fmt: skip
    server = ArrangerServer(config)
    await server.start()
    try:
        found = server.controller.view.find("waiting")
        assert found is not None and found.stage == Stage.PENDING
        # The job that finished before history was kept is given its record.
        (record,) = await server.store.history(HistoryQuery())
        assert (record.name, record.stage, record.owner) == ("finished", "Succeeded", "")
        assert record.end_time == server.controller.jobs[record.job_id].finish_time
    finally:
        await server.stop()
    again = ArrangerServer(config)
    await again.start()  # once only
    try:
        assert len(await again.store.history(HistoryQuery())) == 1
    finally:
        await again.stop()


async def test_a_missing_store_is_an_error_unless_init_says_make_one(tmp_path: Path) -> None:
    config = dataclasses.replace(
        FAST, listen="127.0.0.1:0", data_dir=tmp_path / "elsewhere", init=False
    )
    with pytest.raises(StoreError, match=r"no store at .* --init to create one"):
        await ArrangerServer(config).start()
    assert not (tmp_path / "elsewhere" / "arranger.db").exists()
    made = ArrangerServer(dataclasses.replace(config, init=True))
    await made.start()
    cluster = made.store.cluster_id
    await made.stop()
    again = ArrangerServer(config)  # found now: the same cluster
    await again.start()
    try:
        assert again.store.cluster_id == cluster and len(cluster) == 32
    finally:
        await again.stop()
