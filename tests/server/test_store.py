"""The SQLite store: real files, migrations, group commit, and rows that come back intact."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from arranger.client.specfile import load_job_yaml
from arranger.sched import GpuShare
from arranger.server.controller import Controller
from arranger.server.convert import spec_from_json, spec_to_json
from arranger.server.model import EventRecord, GpuRecord, NodeRecord
from arranger.server.schema import MIGRATIONS
from arranger.server.store import Store, StoreError, batch_of
from arranger.server.validation import parse_job
from arranger.states import PodState

SPEC = """
metadata: {name: rl}
spec:
  leader: {name: learner, template: {command: [python, l.py], resources: {gpu: 1}}}
  workerSets: [{name: actors, counts: 3, template: {command: [python, a.py], env: {A: "1"}}}]
"""


def submitted(controller: Controller, job_id: str = "j1"):  # type: ignore[no-untyped-def]
    spec = parse_job(load_job_yaml(SPEC))
    job, fx = controller.submit(job_id, spec, spec_to_json(spec), now=10.0)
    return job, fx


async def test_records_round_trip_through_the_file(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "a.db", create=True)
    controller = Controller()
    job, fx = submitted(controller)
    leader = job.leader
    leader.state, leader.node, leader.gpus, leader.ports = (
        PodState.RUNNING,
        "n1",
        (GpuShare(3, 1000),),
        {"rpc": 4000},
    )
    job.set_restarts["actors"] = 2
    node = NodeRecord(
        "n1", "10.0.0.1", 8000, 2**34, [GpuRecord(3, "uuid-3", "A100", 2**35)], {"zone": "a"}
    )
    await store.write(batch_of([job], job.pods.values(), [node], fx.events, {}))
    await store.close()

    reopened = await Store.open(tmp_path / "a.db", create=True)
    jobs, nodes = await reopened.load(spec_from_json)
    events = await reopened.events(job.id)
    await reopened.close()
    assert len(jobs) == 1 and jobs[0].spec == job.spec
    loaded = jobs[0]
    assert list(loaded.pods) == list(job.pods) and loaded.pods == job.pods
    assert loaded.set_restarts == {"actors": 2} and loaded.submit_time == 10.0
    assert nodes == [node]
    assert [e.kind for e in events] == ["Submitted"]


async def test_updating_a_job_keeps_its_pods(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "a.db", create=True)
    job, _ = submitted(Controller())
    await store.write(batch_of([job], job.pods.values(), [], [], {}))
    job.reason = "changed"
    await store.write(batch_of([job], [], [], [], {}))
    jobs, _ = await store.load(spec_from_json)
    await store.close()
    assert jobs[0].reason == "changed" and len(jobs[0].pods) == 4


async def test_concurrent_writes_are_group_committed_and_all_durable(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "a.db", create=True)
    events = [EventRecord(float(i), "Test", f"event {i}", "j") for i in range(200)]
    await asyncio.gather(*(store.write(batch_of([], [], [], [e], {})) for e in events))
    stored = await store.events("j", limit=1000)
    await store.close()
    assert [e.message for e in stored] == [f"event {i}" for i in range(200)]


async def test_removing_a_job_removes_its_pods(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "a.db", create=True)
    job, _ = submitted(Controller())
    await store.write(batch_of([job], job.pods.values(), [], [], {}))
    await store.write(batch_of([], [], [], [], {job.id: job}))
    await store.close()
    with sqlite3.connect(tmp_path / "a.db") as db:
        assert db.execute("SELECT COUNT(*) FROM pods").fetchone() == (0,)
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_a_store_from_a_newer_arranger_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    with pytest.raises(StoreError, match="upgrade arranger"):
        await Store.open(path)


async def test_migrations_are_applied_once(tmp_path: Path) -> None:
    await (await Store.open(tmp_path / "a.db", create=True)).close()
    store = await Store.open(tmp_path / "a.db", create=True)  # a second open finds it current
    await store.close()
    with sqlite3.connect(tmp_path / "a.db") as db:
        assert db.execute("PRAGMA user_version").fetchone() == (len(MIGRATIONS),)
