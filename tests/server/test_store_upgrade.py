"""A store written by an older arranger-server opens, migrates and serves with today's code.

The fixture tests/fixtures/store-v4.db was written at schema version 4; every migration since
must bring it forward without losing a job, a pod, a queue, a node or a token. The fixture
tests/fixtures/store-v11.db was written by the previous release (schema version 11) with a job
running on a node: it must keep running on today's server.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import sqlite3
import stat
from pathlib import Path

import grpc
import pytest

from arranger.job import Job
from arranger.security import token_hash
from arranger.server.app import ArrangerServer
from arranger.server.config import ServerConfig
from arranger.server.convert import spec_from_json
from arranger.server.snapshot import build_snapshot
from arranger.server.store import HistoryQuery, StoreError
from arranger.server.store.sqlite import SqliteStore
from arranger.server.store.sqlite_schema import MIGRATIONS
from arranger.states import PodState, Stage
from arranger.v1 import agent_pb2, agent_pb2_grpc
from tests.conftest import FAST, eventually
from tests.played_agent import registration

FIXTURES = Path(__file__).parent.parent / "fixtures"
FIXTURE = FIXTURES / "store-v4.db"
PREVIOUS = FIXTURES / "store-v11.db"  # written by the previous release
CENTURY_S = 36_500 * 86_400.0


def copy_fixture(tmp_path: Path, fixture: Path = FIXTURE) -> Path:
    data = tmp_path / "server"
    data.mkdir()
    shutil.copyfile(fixture, data / "arranger.db")
    return data


def old_config(data: Path) -> ServerConfig:
    """old_config: a server on `data` under which no time limit passes while the test runs:
    the fixtures' times are those they were written at, older every day."""
    return dataclasses.replace(
        FAST,
        listen="127.0.0.1:0",
        data_dir=data,
        scheduler=dataclasses.replace(FAST.scheduler, infeasible_timeout_s=CENTURY_S),
        job_retention_s=CENTURY_S,
        history_retention_s=CENTURY_S,
        controller=dataclasses.replace(FAST.controller, node_timeout_s=120.0),
    )


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
    # Migrations go one way: the store as it was is kept beside it, for the older release.
    (backup,) = data.glob("arranger.db.v4-*.bak")
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    with contextlib.closing(sqlite3.connect(backup)) as old:
        assert old.execute("PRAGMA user_version").fetchone() == (4,)
        assert old.execute("SELECT count(*) FROM jobs").fetchone() == (len(jobs),)
    again = await SqliteStore.open(data / "arranger.db")  # of this version now: no new copy
    await again.close()
    assert list(data.glob("arranger.db.v*.bak")) == [backup]


async def test_a_server_starts_on_a_version_4_store(tmp_path: Path) -> None:
    data = copy_fixture(tmp_path)
    # The fixture's times are those it was written at, older every day: "waiting" (it needs
    # more cpu than the cluster has) has been infeasible since then, and "finished" finished
    # then. Neither the infeasible timeout (the first cycle would fail "waiting" and record
    # it) nor retention (it would prune "finished") may pass while the test runs.
    config = dataclasses.replace(
        FAST,
        listen="127.0.0.1:0",
        data_dir=data,
        scheduler=dataclasses.replace(FAST.scheduler, infeasible_timeout_s=CENTURY_S),
        job_retention_s=CENTURY_S,
        history_retention_s=CENTURY_S,
    )
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


async def test_a_store_of_the_previous_release_keeps_its_running_job_running(
    tmp_path: Path,
) -> None:
    """The previous release's store: `running` (queue research, a learner and a worker
    Running on n1), `waiting` (Pending: it asks more cpu than any node has). Once migrated,
    neither has a checkpoint and no queue a minRunSeconds; when n1's agent comes back with the
    pods, the job runs on, and its token (from the stored key) confirms a checkpoint."""
    data = copy_fixture(tmp_path, PREVIOUS)
    server = ArrangerServer(old_config(data))
    await server.start()
    try:
        with sqlite3.connect(data / "arranger.db") as db:
            assert db.execute("PRAGMA user_version").fetchone() == (len(MIGRATIONS),)
        view = server.controller.view
        job, waiting = view.find("running"), view.find("waiting")
        assert job is not None and waiting is not None
        assert job.stage == Stage.RUNNING and waiting.stage == Stage.PENDING
        assert job.checkpoint_time is None and waiting.checkpoint_time is None
        research = server.controller.queues["research"]
        assert (research.weight, research.max_priority, research.min_run_s) == (2.0, 5, 0.0)
        pods = [
            agent_pb2.PodReport(
                pod_uid=p.uid,
                attempt=p.attempt,
                state="Running",
                pid=4242,
                start_time=p.start_time or 0.0,
            )
            for p in job.pods.values()
        ]
        assert [p.node for p in job.pods.values()] == ["n1", "n1"]
        address = f"127.0.0.1:{server.port}"
        async with grpc.aio.insecure_channel(address) as channel:
            stream = agent_pb2_grpc.AgentServiceStub(channel).Connect()
            await stream.write(agent_pb2.AgentMessage(register=registration("n1", pods=pods)))
            await stream.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat()))
            try:
                await eventually(lambda: server.controller.nodes["n1"].connected, what="n1")
                await server.writes.written()
                assert job.stage == Stage.RUNNING
                assert all(
                    p.state == PodState.RUNNING and not p.stopping for p in job.pods.values()
                )
                snapshot = build_snapshot(server.controller, server.clock())
                info = {j.name: j for j in snapshot.jobs}["running"]
                assert len(info.running) == 2 and info.checkpoint_time is None
                queues = {q.name: q for q in snapshot.queues}
                assert queues["research"].min_run_s == 0.0 == queues["default"].min_run_s
                token = server.job_tokens.token(job.id)
                sdk = Job(address, token, job.id)
                try:
                    reply = await asyncio.to_thread(sdk.checkpointed)
                finally:
                    sdk.close()
                assert reply.status.stage == "Running" and job.checkpoint_time is not None
                snapshot = build_snapshot(server.controller, server.clock())
                info = {j.name: j for j in snapshot.jobs}["running"]
                assert info.checkpoint_time == job.checkpoint_time and len(info.running) == 2
                assert job.stage == Stage.RUNNING
            finally:
                stream.cancel()
    finally:
        await server.stop()
