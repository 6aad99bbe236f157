"""Two servers share one PostgreSQL store: one is active, the other a standby that refuses
every call naming the active one and takes over when the active one stops. Clients given both
addresses follow on their own. (Real servers, real gRPC, a real PostgreSQL: tests/postgres.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from arranger.client.sdk import ArrangerError, AsyncClient
from arranger.job import Job
from arranger.sched.config import SchedulerConfig
from arranger.server.app import ArrangerServer
from arranger.server.controller import Controller
from arranger.server.store import batch_of, open_store
from tests.conftest import FAST, eventually, job_spec
from tests.postgres import PostgresServer
from tests.server.test_store import submitted

LEASE_S = 2.0


def server_on(store: str, data_dir: Path) -> ArrangerServer:
    config = dataclasses.replace(  # a job that never fits waits (its token stays good)
        FAST,
        listen="127.0.0.1:0",
        store=store,
        data_dir=data_dir,
        lease_s=LEASE_S,
        scheduler=SchedulerConfig(infeasible_timeout_s=3600.0),
    )
    return ArrangerServer(config)


async def health(address: str, service: str = "") -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return int(reply.status)


async def test_a_standby_names_the_active_server_and_takes_over_when_it_stops(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    url = postgres.new_database()
    a = server_on(url, tmp_path / "a")
    await a.start()
    assert a.leadership is not None
    b = server_on(url, tmp_path / "b")
    b_started = asyncio.ensure_future(b.start())
    try:
        await eventually(lambda: b.leadership is not None and b.leadership.active, what="standby")
        a_address, b_address = f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"
        assert not b_started.done()
        async with AsyncClient(b_address, timeout_s=5) as only_b:
            with pytest.raises(ArrangerError) as refused:
                await only_b.jobs()
        assert refused.value.code == grpc.StatusCode.UNAVAILABLE
        assert f"standby; the active server is {a_address}" in refused.value.message
        serving = health_pb2.HealthCheckResponse.SERVING
        assert await health(b_address) != serving
        assert await health(b_address, "arranger.v1.Arranger") != serving
        assert await health(a_address, "arranger.v1.Arranger") == serving

        async with AsyncClient(f"{b_address},{a_address}", timeout_s=20) as both:
            kept = await both.submit(job_spec("kept", ["true"], cpu=1000))  # stays Pending
            assert both.current == a_address
            # The job's own calls, given both servers (apiAddresses), follow the takeover too.
            job_id = kept.metadata.id
            own = Job(f"{b_address},{a_address}", a.job_tokens.token(job_id), job_id)
            digest = a.job_tokens.digest(job_id)
            assert (await asyncio.to_thread(own.get)).metadata.name == "kept"
            assert own.current == a_address
            events = own.subscribe()
            await eventually(lambda: digest in a.streams.tokens("job"), what="the job's stream")

            stopped = time.monotonic()
            await a.stop()  # lets the lease go: b need not wait for its term
            await asyncio.wait_for(b_started, timeout=10)
            took = time.monotonic() - stopped
            assert took < LEASE_S, f"the standby took {took:.1f} s to take over"
            job = await both.get("kept")  # a is gone: the client moves to b by itself
            assert both.current == b_address and job.status.stage == "Pending"
            assert b.leadership is not None and b.leadership.epoch > a.leadership.epoch
            assert await health(b_address) == serving

            await eventually(lambda: digest in b.streams.tokens("job"), what="stream on b")
            assert (await asyncio.to_thread(own.get)).status.stage == "Pending"
            assert own.current == b_address and not events.ended.is_set()
            await both.stop("kept")
            await eventually(events.ended.is_set, what="the job's events to end with it")
            own.close()
    finally:
        b_started.cancel()
        await a.stop()
        await b.stop()


async def test_a_store_that_loads_for_longer_than_a_term_keeps_its_server_active(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    """The lease is renewed from its own thread, from the moment it is taken: loading a large
    store (seconds of work on the event loop) or applying long cycles never costs it."""
    url = postgres.new_database()
    store = await open_store(url, create=True)
    controller = Controller()
    jobs = [submitted(controller, f"j{i}", f"rl-{i}")[0] for i in range(2_000)]
    await store.write(batch_of(jobs, [p for j in jobs for p in j.pods.values()], [], [], {}))
    await store.close()
    config = dataclasses.replace(  # jobs that wait for nodes, not fail as infeasible
        FAST,
        listen="127.0.0.1:0",
        store=url,
        data_dir=tmp_path / "a",
        lease_s=1.0,
        scheduler=SchedulerConfig(infeasible_timeout_s=3600.0),
    )
    server = ArrangerServer(config)
    await server.start()
    try:
        assert server.leadership is not None and server.leadership.holds()
        # Loading 2,000 jobs takes longer than the 1 s term on a 2-core machine (about 1.1 s).
        # Three more renewals while 2,000 jobs that never fit (no nodes) are scheduled.
        # A cycle runs only when something could change a decision: each is asked for.
        leadership, renewed = server.leadership, server.leadership.renewals
        for _ in range(3):
            cycles = server.cycles
            server.trigger()
            await eventually(lambda n=cycles: server.cycles > n, what="a cycle")
        await eventually(lambda: leadership.renewals >= renewed + 3, what="three renewals")
        assert not leadership.lost.is_set(), leadership.reason
        assert server.closed() == ""
    finally:
        await server.stop()
