"""Every store backend, the same tests: each runs against a SQLite file and a real PostgreSQL
server (see tests/postgres.py), through the store interface alone."""

from __future__ import annotations

import asyncio
import itertools
import math

import pytest

from arranger.client.specfile import load_job_yaml
from arranger.sched import GpuShare
from arranger.server.controller import Controller
from arranger.server.convert import spec_from_json, spec_to_json
from arranger.server.effects import Pruning
from arranger.server.history import HistoryRecord
from arranger.server.model import EventRecord, GpuRecord, JobRecord, NodeRecord
from arranger.server.queues import DEFAULT, QueueRecord
from arranger.server.store import (
    PRUNE_BATCH,
    Batch,
    HistoryQuery,
    Store,
    StoreError,
    batch_of,
    open_store,
)
from arranger.server.validation import parse_job
from arranger.states import PodState, Stage

SPEC = """
metadata: {name: rl}
spec:
  leader: {name: learner, template: {command: [python, l.py], resources: {gpu: 1}}}
  workerSets: [{name: actors, counts: 3, template: {command: [python, a.py], env: {A: "1"}}}]
"""


def submitted(controller: Controller, job_id: str = "j1", name: str = "rl"):  # type: ignore[no-untyped-def]
    spec = parse_job(load_job_yaml(SPEC.replace("name: rl", f"name: {name}")))
    return controller.submit(job_id, spec, spec_to_json(spec), now=10.0)


def record(job_id: str, end: float, owner: str = "alice", queue: str = "default") -> HistoryRecord:
    return HistoryRecord(
        job_id=job_id,
        name=job_id,
        owner=owner,
        queue=queue,
        priority=0,
        submit_time=0.0,
        start_time=1.0,
        end_time=end,
        stage="Succeeded",
        reason="",
        message="",
        stopped_by="",
        leader_exit=0,
        worker_exits=((0, 3), (None, 1)),
        nodes=("n1",),
        pods=4,
        restarts=0,
        cpu_core_hours=0.5,
        gpu_hours=0.25,
        memory_gib_hours=1.0,
    )


async def fresh(url: str) -> Store:
    return await open_store(url, create=True)


async def test_records_round_trip(store_url: str) -> None:
    store = await fresh(store_url)
    assert store.created and len(store.cluster_id) == 32
    controller = Controller()
    job, fx = submitted(controller)
    leader = job.leader
    leader.state, leader.node, leader.gpus, leader.ports = (
        PodState.RUNNING,
        "n1",
        (GpuShare(3, 1000),),
        {"rpc": 4000},
    )
    leader.exit_code, leader.start_time, leader.held_since = None, 12.5, 12.0
    job.set_restarts["actors"] = 2
    job.nodes_used, job.owner, job.cpu_core_s = ["n1"], "alice", 3.25
    job.checkpoint_time = 11.75
    node = NodeRecord(
        "n1",
        "10.0.0.1",
        8000,
        2**34,
        [GpuRecord(3, "uuid-3", "A100", 2**35)],
        {"zone": "a"},
        cordoned=True,
        runtimes=["podman"],
    )
    await store.write(batch_of([job], job.pods.values(), [node], fx.events, {}))
    await store.close()

    reopened = await open_store(store_url)
    jobs, nodes = await reopened.load(spec_from_json)
    events = await reopened.events(job.id)
    assert not reopened.created and reopened.cluster_id == store.cluster_id
    await reopened.close()
    assert len(jobs) == 1 and jobs[0].spec == job.spec
    loaded = jobs[0]
    assert list(loaded.pods) == list(job.pods) and loaded.pods == job.pods
    assert loaded == job
    assert nodes == [node]
    assert [e.kind for e in events] == ["Submitted"] and events[0].job_id == job.id


async def test_updating_a_job_keeps_its_pods_and_removing_it_takes_them(store_url: str) -> None:
    store = await fresh(store_url)
    job, _ = submitted(Controller())
    await store.write(batch_of([job], job.pods.values(), [], [], {}))
    job.reason = "changed"
    await store.write(batch_of([job], [], [], [], {}))
    jobs, _ = await store.load(spec_from_json)
    assert jobs[0].reason == "changed" and len(jobs[0].pods) == 4
    await store.write(batch_of([], [], [], [], {job.id: job}))
    stored = await store.read_records(
        [job.id], [p.uid for p in job.pods.values()], [], [], spec_from_json
    )
    await store.close()
    assert stored.jobs == {} and stored.pods == {}


async def test_a_name_passed_from_an_ended_job_to_a_new_one_in_one_write(store_url: str) -> None:
    """Changes written together are written from the records as they are: the new job that
    takes the name of one that ended in the same write never meets it in the name index,
    whatever order the changes came in."""
    store = await fresh(store_url)
    controller = Controller()
    old, _ = submitted(controller, "j1", "same")
    await store.write(batch_of([old], old.pods.values(), [], [], {}))
    old.stage = Stage.FAILED
    new, _ = submitted(controller, "j2", "same")
    await store.write(batch_of([new, old], new.pods.values(), [], [], {}))
    jobs, _ = await store.load(spec_from_json)
    await store.close()
    assert {(j.id, j.stage) for j in jobs} == {("j1", Stage.FAILED), ("j2", Stage.PENDING)}


async def test_concurrent_writes_are_stored_in_the_order_asked(store_url: str) -> None:
    store = await fresh(store_url)
    events = [EventRecord(float(i), "Test", f"event {i}", "j") for i in range(200)]
    await asyncio.gather(*(store.write(batch_of([], [], [], [e], {})) for e in events))
    stored = await store.events("j", limit=1000)
    newest = await store.events("j", limit=5)
    await store.close()
    assert [e.message for e in stored] == [f"event {i}" for i in range(200)]
    assert [e.message for e in newest] == [f"event {i}" for i in range(195, 200)]


async def test_a_failed_write_stores_nothing_of_its_batch(store_url: str) -> None:
    store = await fresh(store_url)
    controller = Controller()
    first, _ = submitted(controller, "j1", "same")
    await store.write(batch_of([first], first.pods.values(), [], [], {}))
    second, _ = submitted(controller, "j2", "other")
    refused = batch_of([second], [], [], [EventRecord(1.0, "Test", "lost with it", "j2")], {})
    refused.jobs[0]["name"] = "same"  # two unfinished jobs of one name: refused
    later = batch_of([], [], [], [EventRecord(2.0, "Test", "later", "j2")], {})
    results = await asyncio.gather(store.write(refused), store.write(later), return_exceptions=True)
    assert isinstance(results[0], StoreError) and results[1] is None  # a transaction each
    jobs, _ = await store.load(spec_from_json)
    assert [j.id for j in jobs] == ["j1"]
    assert [e.message for e in await store.events("j2")] == ["later"]  # it still writes
    await store.close()


async def test_queues_are_kept_and_removed(store_url: str) -> None:
    store = await fresh(store_url)
    assert [q.name for q in await store.load_queues()] == ["default"]
    research = QueueRecord(
        "research", 2.0, 4000, None, 2000, ("a100",), ("alice", "bob"), 5, True, 600.5
    )
    await store.write(batch_of([], [], [], [], (), queues=[research]))
    assert await store.load_queues() == [DEFAULT, research]  # a new cluster's default queue
    stored = await store.read_records([], [], [], ["research", "none"], spec_from_json)
    assert stored.queues == {"research": research}
    await store.write(batch_of([], [], [], [], (), removed_queues=["research"]))
    assert await store.load_queues() == [DEFAULT]
    await store.close()


async def test_tokens_are_issued_checked_used_and_revoked(store_url: str) -> None:
    store = await fresh(store_url)
    await store.add_token("alice-1", "alice", "user", "hash-a", 100.0)
    await store.add_token("root", "root", "admin", "hash-r", 101.0)
    with pytest.raises(StoreError, match="a token named 'alice-1' exists"):
        await store.add_token("alice-1", "mallory", "admin", "hash-m", 102.0)
    assert await store.token_owner("hash-a") == ("alice", "user")
    assert await store.token_owner("hash-m") is None
    revoked = await store.tokens_revoked(["hash-a", "hash-r", "gone"], 200.0, note=["hash-a"])
    assert revoked == {"gone"}
    tokens = {t.name: t for t in await store.list_tokens()}
    assert list(tokens) == ["alice-1", "root"]
    assert tokens["alice-1"].last_used == 200.0 and tokens["root"].last_used is None
    assert tokens["root"].role == "admin" and tokens["root"].created == 101.0
    assert await store.delete_token("alice-1") and not await store.delete_token("alice-1")
    assert await store.tokens_revoked(["hash-a"], 300.0) == {"hash-a"}
    await store.close()


async def test_history_pages_by_end_time_and_id(store_url: str) -> None:
    store = await fresh(store_url)
    records = [record(f"j{i:02}", float(i // 2), "alice" if i % 3 else "bob") for i in range(20)]
    await store.write(batch_of([], [], [], [], (), history=records))
    await store.write(batch_of([], [], [], [], (), history=[records[0]]))  # written again: one
    page, after, seen = [], (-math.inf, ""), []
    while page or not seen:
        page = await store.history(HistoryQuery(after=after, limit=7))
        seen.extend(page)
        if page:
            after = (page[-1].end_time, page[-1].job_id)
    assert seen == records  # in (end time, id) order, each once
    bobs = await store.history(HistoryQuery(user="bob"))
    assert [r.job_id for r in bobs] == [r.job_id for r in records if r.owner == "bob"]
    early = await store.history(HistoryQuery(until=3.0, user="alice"))
    assert all(r.end_time < 3.0 and r.owner == "alice" for r in early) and len(early) == 4
    assert early[0].worker_exits == ((0, 3), (None, 1)) and early[0].nodes == ("n1",)
    await store.close()


async def test_finished_jobs_without_history_are_found(store_url: str) -> None:
    store = await fresh(store_url)
    controller = Controller()
    jobs: list[JobRecord] = []
    for i in range(3):
        job, _ = submitted(controller, f"j{i}", f"rl-{i}")
        job.stage, job.finish_time = Stage.SUCCEEDED, 50.0 + i
        jobs.append(job)
    jobs[2].stage, jobs[2].finish_time = Stage.RUNNING, None
    await store.write(batch_of(jobs, [], [], [], (), history=[record("j0", 50.0)]))
    assert await store.finished_without_history(-math.inf) == ["j1"]
    assert await store.finished_without_history(60.0) == []
    await store.close()


async def test_pruning_deletes_bounded_batches(store_url: str) -> None:
    store = await fresh(store_url)
    job, fx = submitted(Controller())
    old_events = [EventRecord(float(i), "Old", "", "") for i in range(PRUNE_BATCH + 10)]
    await store.write(
        batch_of(
            [job],
            [],
            [],
            [*fx.events, *old_events],
            {},
            history=[record("h1", 5.0), record("h2", 500.0)],
        )
    )
    pruning = Batch(pruned=Pruning(jobs=(job.id,), events_before=1e9, history_before=100.0))
    pruning.removed_jobs.append(job.id)
    await store.write(pruning)
    assert store.pruned_rows == PRUNE_BATCH  # a full batch: there may be more
    assert len(await store.events(limit=100_000)) == 10
    assert [r.job_id for r in await store.history(HistoryQuery())] == ["h2"]
    await store.write(Batch(pruned=Pruning(events_before=1e9)))
    assert store.pruned_rows == 10 and await store.events() == []
    await store.reclaim()
    await store.close()


async def test_no_store_is_made_without_create(store_url: str) -> None:
    with pytest.raises(StoreError, match="--init to create one"):
        await open_store(store_url)
    await (await fresh(store_url)).close()
    again = await open_store(store_url, migrate=False)  # a command beside the server
    assert not again.created
    await again.close()
    with pytest.raises(StoreError, match="is closed"):
        await again.write(batch_of([], [], [], [EventRecord(1.0, "Test", "")], {}))


def test_a_url_names_a_store_or_is_refused() -> None:
    for url in ("mysql://x/y", "sqlite://relative.db", "arranger.db"):
        with pytest.raises(StoreError, match="store '"):
            asyncio.run(open_store(url))


async def test_events_are_read_a_page_at_a_time_newest_page_first(store_url: str) -> None:
    store = await fresh(store_url)
    events = [EventRecord(float(i), "Test", f"e{i}", "j" if i % 2 else "k") for i in range(50)]
    await store.write(batch_of([], [], [], events, {}))
    newest = await store.events(limit=10)
    older = await store.events(limit=10, before=newest[0].seq)
    of_j = await store.events("j", limit=5, before=newest[-1].seq)
    oldest = await store.events("j", limit=100, before=of_j[0].seq)
    await store.close()
    assert [e.message for e in newest] == [f"e{i}" for i in range(40, 50)]
    assert [e.message for e in older] == [f"e{i}" for i in range(30, 40)]
    assert [e.message for e in of_j] == [f"e{i}" for i in range(39, 49, 2)]
    assert [e.message for e in oldest] == [f"e{i}" for i in range(1, 39, 2)]
    assert all(a.seq < b.seq for a, b in itertools.pairwise(newest))
