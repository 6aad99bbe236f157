"""What the scheduler weighs when it chooses whom to evict, through a real server: a queue's
`minRunSeconds` (kept, shown, refused when out of range, handed to the core as
QueueInfo.min_run_s) and a job's last confirmed checkpoint (ConfirmCheckpoint at any time, kept
on the server's clock, handed to the core as JobInfo.checkpoint_time; under a notice it still
ends the notice). Each runs on each store backend where it stores something, and the server
is started again on the store to see it kept.

The node is an agent the test plays (tests/played_agent.py): it answers every launch with a
Running report and every kill with a Killed one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from arranger.client.channel import ArrangerError
from arranger.client.sdk import AsyncClient, queue_message
from arranger.client.text import seconds_of
from arranger.job import Job
from arranger.sched import JobInfo, QueueInfo, Snapshot
from arranger.sched.config import SchedulerConfig
from arranger.server.app import ArrangerServer
from arranger.server.clock import SteadyClock
from arranger.server.snapshot import build_snapshot
from arranger.states import PodState, Stage
from tests.conftest import FAST, bare_server, eventually, job_spec
from tests.played_agent import AnsweringAgent, played_agent, registration

# Jobs wait for room as long as the test needs; the played node is not declared lost meanwhile.
PATIENT = dataclasses.replace(
    FAST,
    scheduler=SchedulerConfig(infeasible_timeout_s=3600.0),
    controller=dataclasses.replace(FAST.controller, node_timeout_s=120.0),
)
REFUSED = "queue.minRunSeconds: must be 0..604800 seconds (0: off; at most 7 days)"


def snapshots(server: ArrangerServer) -> list[Snapshot]:
    """snapshots: the core's input now, from every record and as the server keeps it."""
    now = server.clock()
    return [build_snapshot(server.controller, now), server.state.snapshot(now)]


def queue_infos(server: ArrangerServer) -> list[dict[str, QueueInfo]]:
    return [{q.name: q for q in snapshot.queues} for snapshot in snapshots(server)]


def job_infos(server: ArrangerServer) -> list[dict[str, JobInfo]]:
    return [{j.name: j for j in snapshot.jobs} for snapshot in snapshots(server)]


async def test_a_queues_min_run_seconds_is_kept_shown_and_reaches_the_snapshot(
    tmp_path: Path, store_url: str
) -> None:
    config = dataclasses.replace(FAST, store=store_url)
    async with (
        bare_server(tmp_path / "server", config) as server,
        AsyncClient(f"127.0.0.1:{server.port}", timeout_s=10) as client,
    ):
        research = queue_message("research", 2.0)
        research.min_run_seconds = 600.0
        assert (await client.create_queue(research)).min_run_seconds == 600.0
        listed = {q.name: q for q in await client.queues()}
        assert listed["research"].min_run_seconds == 600.0
        assert listed["default"].min_run_seconds == 0.0  # off unless set
        for infos in queue_infos(server):
            assert infos["research"].min_run_s == 600.0 and infos["default"].min_run_s == 0.0
        research.min_run_seconds = 30.5
        assert (await client.update_queue(research)).min_run_seconds == 30.5
        for infos in queue_infos(server):
            assert infos["research"].min_run_s == 30.5
    async with (
        bare_server(tmp_path / "again", config) as again,
        AsyncClient(f"127.0.0.1:{again.port}", timeout_s=10) as client,
    ):
        listed = {q.name: q for q in await client.queues()}
        assert listed["research"].min_run_seconds == 30.5 and listed["research"].weight == 2.0
        for infos in queue_infos(again):
            assert infos["research"].min_run_s == 30.5


async def test_a_min_run_seconds_out_of_range_is_refused_naming_the_field(tmp_path: Path) -> None:
    async with (
        bare_server(tmp_path / "server") as server,
        AsyncClient(f"127.0.0.1:{server.port}", timeout_s=10) as client,
    ):
        for bad in (-1.0, -1e-9, 604_800.5, 1e300, math.inf, -math.inf, math.nan):
            queue = queue_message("research")
            queue.min_run_seconds = bad
            with pytest.raises(ArrangerError) as refused:
                await client.create_queue(queue)
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT, bad
            assert refused.value.message == REFUSED, bad
        assert "research" not in server.controller.queues
        week = queue_message("research")
        week.min_run_seconds = 604_800.0  # the most
        await client.create_queue(week)
        week.min_run_seconds = -5.0
        with pytest.raises(ArrangerError) as refused:
            await client.update_queue(week)
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.message == REFUSED
        assert server.controller.queues["research"].min_run_s == 604_800.0  # as it was


@contextlib.asynccontextmanager
async def node_of(server: ArrangerServer) -> AsyncIterator[AnsweringAgent]:
    async with played_agent(f"127.0.0.1:{server.port}", registration("n1")) as stream:
        node = AnsweringAgent(stream)
        try:
            await eventually(lambda: "n1" in server.controller.nodes, what="n1 to register")
            yield node
        finally:
            await node.stop()


def learner_only(name: str, priority: int, **spec: Any) -> dict[str, Any]:
    """learner_only: a job of one learner of 3 cores (a node has 4) and no worker yet."""
    body = job_spec(name, ["sleep", "1000"], workers=0, cpu=3, priority=priority, **spec)
    body["spec"]["workerSets"][0]["maxCounts"] = 1
    return body


async def test_a_checkpoint_is_kept_at_any_time_ends_a_notice_and_survives_a_restart(
    tmp_path: Path, store_url: str
) -> None:
    config = dataclasses.replace(PATIENT, store=store_url)
    ahead = SteadyClock(wall=lambda: time.time() + 3600.0)  # the pods' clocks do not count
    server = ArrangerServer(
        dataclasses.replace(config, listen="127.0.0.1:0", data_dir=tmp_path / "server"),
        clock=ahead,
    )
    async with (
        bare_server(tmp_path / "server", server=server),
        AsyncClient(f"127.0.0.1:{server.port}", timeout_s=10) as client,
        node_of(server) as node,
    ):
        lo_id = (await client.submit(learner_only("lo", 1, evictionNoticeSeconds=120))).metadata.id
        lo = server.controller.jobs[lo_id]
        await eventually(lambda: lo.stage == Stage.RUNNING, what="lo to run")
        job = Job(f"127.0.0.1:{server.port}", server.job_tokens.token(lo_id), lo_id)
        try:
            # No notice runs: the checkpoint is kept, and nothing else happens.
            for infos in job_infos(server):
                assert infos["lo"].checkpoint_time is None
            before = server.clock()
            reply = await asyncio.to_thread(job.checkpointed)
            first = lo.checkpoint_time
            assert first is not None and before <= first <= server.clock()
            assert reply.status.stage == "Running"
            assert seconds_of(reply.status.checkpoint_time) == pytest.approx(first, abs=1e-6)
            for infos in job_infos(server):
                assert infos["lo"].checkpoint_time == first and len(infos["lo"].running) == 1
            assert lo.leader.evict_at is None and not node.killed

            # hi takes lo's room: lo is given notice; the learner's checkpoint ends it.
            await client.submit(learner_only("hi", 5))
            await eventually(lambda: lo.leader.evict_at is not None, what="the notice")
            assert not node.killed and lo.stage == Stage.RUNNING
            reply = await asyncio.to_thread(job.checkpointed)
            second = lo.checkpoint_time
            assert second is not None and second > first
            assert (reply.status.stage, reply.status.reason) == ("Pending", "Preempted")
            assert seconds_of(reply.status.checkpoint_time) == pytest.approx(second, abs=1e-6)
            await eventually(lambda: node.killed == ["lo-learner"], what="lo to be stopped")
            await eventually(lambda: "hi-learner" in node.launched, what="hi to be launched")
            events = [(e.kind, e.message) for e in await client.events("lo")]
            assert any(kind == "EvictionNotice" for kind, _ in events), events
            assert any(
                kind == "Checkpointed" and "s of notice left; evicted" in message
                for kind, message in events
            ), events
            await eventually(lambda: lo.leader.state == PodState.PENDING, what="lo to wait")
            for infos in job_infos(server):
                assert infos["lo"].checkpoint_time == second and infos["lo"].pending
        finally:
            job.close()
    async with (
        bare_server(tmp_path / "again", config) as again,
        AsyncClient(f"127.0.0.1:{again.port}", timeout_s=10) as client,
    ):
        assert again.controller.jobs[lo_id].checkpoint_time == second
        shown = (await client.get("lo")).status.checkpoint_time
        assert seconds_of(shown) == pytest.approx(second, abs=1e-6)
        for infos in job_infos(again):
            assert infos["lo"].checkpoint_time == second
            assert infos["hi"].checkpoint_time is None  # never confirmed one


async def test_an_ended_job_keeps_no_checkpoint(tmp_path: Path) -> None:
    async with (
        bare_server(tmp_path / "server", PATIENT) as server,
        AsyncClient(f"127.0.0.1:{server.port}", timeout_s=10) as client,
    ):
        await client.submit(learner_only("lo", 1))
        await client.stop("lo")
        with pytest.raises(ArrangerError) as refused:
            await client.confirm_checkpoint("lo")
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.message == "job 'lo' has ended; no checkpoint of it is kept"
        found = server.controller.view.find("lo")
        assert found is not None and found.checkpoint_time is None


async def test_a_queues_min_run_seconds_shields_its_pods_until_it_is_lifted(
    tmp_path: Path,
) -> None:
    """hi may preempt lo (same queue, lower priority), but lo has run less than the queue's
    minRunSeconds: nothing is evicted, and hi's message says why. Once the queue is updated
    to no shield, the next cycle evicts lo for hi."""
    async with (
        bare_server(tmp_path / "server", PATIENT) as server,
        AsyncClient(f"127.0.0.1:{server.port}", timeout_s=10) as client,
        node_of(server) as node,
    ):
        team = queue_message("team")
        team.min_run_seconds = 3600.0
        await client.create_queue(team)
        lo_body, hi_body = learner_only("lo", 1), learner_only("hi", 5)
        for body in (lo_body, hi_body):
            body["metadata"]["queue"] = "team"
        lo_id = (await client.submit(lo_body)).metadata.id
        lo = server.controller.jobs[lo_id]
        await eventually(lambda: lo.stage == Stage.RUNNING, what="lo to run")
        hi_id = (await client.submit(hi_body)).metadata.id
        hi = server.controller.jobs[hi_id]
        await eventually(lambda: "minRunSeconds" in hi.message, what=f"hi's reason: {hi.message}")
        assert lo.stage == Stage.RUNNING and not node.killed and hi.leader.state == PodState.PENDING
        team.min_run_seconds = 0.0
        await client.update_queue(team)
        await eventually(lambda: node.killed == ["lo-learner"], what="lo to be evicted")
        await eventually(lambda: "hi-learner" in node.launched, what="hi to be launched")
