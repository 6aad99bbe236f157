"""The in-job SDK against real servers: its event stream outlives a server restart, and ends
with the job."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time
from pathlib import Path

import pytest

import arranger.job
from arranger.client.sdk import AsyncClient
from arranger.job import Job, Member, news
from arranger.sched.config import SchedulerConfig
from arranger.server.app import ArrangerServer
from arranger.server.clock import SteadyClock
from arranger.server.effects import Effects
from tests.conftest import FAST, bare_server, eventually, job_spec

# The job waits for nodes that never come: it must stay live (so must its token) meanwhile.
PATIENT = dataclasses.replace(FAST, scheduler=SchedulerConfig(infeasible_timeout_s=3600))


async def test_a_subscription_opens_again_after_a_server_restart_and_ends_with_the_job(
    tmp_path: Path,
) -> None:
    data = tmp_path / "server"
    async with bare_server(data, PATIENT) as first:
        port = first.port
        async with AsyncClient(f"127.0.0.1:{port}") as client:
            submitted = await client.submit(job_spec("el", ["true"]))
        job_id = submitted.metadata.id
        token, digest = first.job_tokens.token(job_id), first.job_tokens.digest(job_id)
        job = Job(f"127.0.0.1:{port}", token, job_id)
        events = job.subscribe()
        events.RETRY_S = 0.05  # type: ignore[misc]  # the test's server comes back at once
        await eventually(lambda: digest in first.streams.tokens("job"), what="the stream")
    try:
        again = ArrangerServer(
            dataclasses.replace(PATIENT, listen=f"127.0.0.1:{port}", data_dir=data)
        )
        async with bare_server(data, server=again):
            await eventually(lambda: digest in again.streams.tokens("job"), what="reopened")
            assert not events.ended.is_set()
            async with AsyncClient(f"127.0.0.1:{port}") as client:
                await client.stop("el")
            await eventually(events.ended.is_set, what="the subscription to end with the job")
    finally:
        events.close()
        job.close()


def test_a_withdrawn_notice_is_told_and_a_carried_out_one_is_not() -> None:
    running = Member("el-a-1", "worker", "a", 1, 1, "Running")
    noticed = dataclasses.replace(running, evict_at=130.0)
    assert [(e.kind, e.seconds_left) for e in news(running, noticed, 100.0)] == [("evicting", 30.0)]
    assert [e.kind for e in news(noticed, running, 110.0)] == ["withdrawn"]
    stopped = dataclasses.replace(running, stopping=True)  # the eviction carried out
    assert news(noticed, stopped, 130.0) == []
    assert [e.kind for e in news(stopped, dataclasses.replace(stopped, state="Killed"), 131.0)] == [
        "lost"
    ]
    leader = Member("el-l", "leader", "", -1, -1, "Running", evict_at=160.0)
    assert [e.kind for e in news(None, leader, 100.0)] == ["job-evicting"]


async def test_the_time_left_under_notice_is_counted_on_the_servers_clock(tmp_path: Path) -> None:
    """A server whose clock is an hour ahead of the pod's machine: the learner is still told
    the notice's own length, not an hour more."""
    ahead = SteadyClock(wall=lambda: time.time() + 3600.0)
    server = ArrangerServer(
        dataclasses.replace(PATIENT, listen="127.0.0.1:0", data_dir=tmp_path / "s"), clock=ahead
    )
    async with bare_server(tmp_path / "s", server=server):
        async with AsyncClient(f"127.0.0.1:{server.port}") as client:
            job_id = (await client.submit(job_spec("el", ["true"]))).metadata.id
        job = Job(f"127.0.0.1:{server.port}", server.job_tokens.token(job_id), job_id)
        events = job.subscribe()
        try:
            digest = server.job_tokens.digest(job_id)
            await eventually(lambda: digest in server.streams.tokens("job"), what="the stream")
            record = server.controller.view.job(job_id)
            assert record is not None
            leader = record.leader  # put under notice of 30 s, as an eviction would
            leader.evict_at, leader.evict_why = server.clock() + 30.0, "test"
            fx = Effects()
            fx.pods.add(leader.uid)
            await server.commit(fx)
            told = await eventually(lambda: events.get(timeout_s=0), what="the notice")
            assert told.kind == "job-evicting" and 25.0 <= (told.seconds_left or 0) <= 30.0
        finally:
            events.close()
            job.close()


async def test_a_server_that_takes_connections_and_never_answers_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first address of ARRANGER_API is a machine that accepts connections and answers
    nothing (as one powered off behind a proxy, or cut off mid-stream): a call tries it for
    TRY_S, then goes to the next, and stays there."""
    monkeypatch.setattr(arranger.job, "TRY_S", 0.5)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # listens, never accepts
        async with bare_server(tmp_path / "s", PATIENT) as server:
            async with AsyncClient(f"127.0.0.1:{server.port}") as client:
                job_id = (await client.submit(job_spec("el", ["true"]))).metadata.id
            api = f"127.0.0.1:{silent.getsockname()[1]},127.0.0.1:{server.port}"
            job = Job(api, server.job_tokens.token(job_id), job_id)
            try:
                assert (await asyncio.to_thread(job.get, 10.0)).metadata.name == "el"
                assert job.current == f"127.0.0.1:{server.port}"
            finally:
                job.close()
