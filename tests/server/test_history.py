"""Every finished job keeps a history record, written with the change that finishes it.

Usage is each attempt's request times how long it held its node (launch to end, or to the
job's end); records outlive `arranger delete`; every user may list them.
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import io
import json
from pathlib import Path

import pytest

from arranger.client import cli
from arranger.client.history import parse_when
from arranger.client.sdk import AsyncClient
from arranger.client.specfile import load_job_yaml
from arranger.sched import JobDecision, Placement, Plan
from arranger.server.app import ArrangerServer
from arranger.server.controller import Controller, ControllerConfig
from arranger.server.convert import spec_to_json
from arranger.server.effects import Effects
from arranger.server.history import PodExit
from arranger.server.nodes import NodeRegistration, PodReport
from arranger.server.validation import parse_job
from arranger.states import PodState, ScheduleState
from tests.conftest import FAST, bare_server, job_spec, printed
from tests.server.test_history_outcome import written

SPEC = """
metadata: {name: acct}
spec:
  restartLimit: 2
  leader: {name: learner, template: {command: [l], resources: {cpu: 2, memory: 4Gi, gpu: 1}}}
  workerSets: [{name: actors, counts: 1, template: {command: [a], resources: {cpu: 1, memory: 2Gi}}}]
"""


def test_usage_counts_each_attempt_for_the_time_it_held_its_node() -> None:
    c = Controller(ControllerConfig(backoff_initial_s=1.0))
    for name in ("n1", "n2"):
        c.node_registered(NodeRegistration(name, f"10.0.0.{name[1]}", 8000, 2**34), 100.0)
    spec = parse_job(load_job_yaml(SPEC))
    job, _ = c.submit("j", spec, spec_to_json(spec), 100.0, owner="ann")
    leader, worker = job.pods["acct-learner"], job.pods["acct-actors-0"]
    placed = [Placement("j", leader.name, "n1"), Placement("j", worker.name, "n2")]
    decision = {"j": JobDecision("j", ScheduleState.SCHEDULED_SUCCEED)}
    c.apply_plan(Plan(placed, decision), 100.0)  # the leader launches at 100

    def report(pod: str, state: PodState, now: float, code: int | None = None) -> Effects:
        p = job.pods[pod]
        ports = {"rpc": 7000} if pod == leader.name else {}
        report = PodReport(p.uid, p.attempt, state, 1, code, ports=ports)
        return c.pod_reports(p.node, [report], now)

    report(leader.name, PodState.RUNNING, 100.0)  # the worker launches at 100
    report(worker.name, PodState.RUNNING, 100.0)
    report(worker.name, PodState.FAILED, 160.0, code=1)  # 60 s held; back-off to 161
    assert not c.tick(150.0).launches
    assert [o.pod_uid for o in c.tick(200.0).launches] == [worker.uid]  # held again from 200
    (record,) = report(leader.name, PodState.SUCCEEDED, 400.0, code=0).history
    assert (record.stage, record.reason, record.owner) == ("Succeeded", "LeaderSucceeded", "ann")
    assert record.cpu_core_hours * 3600 == pytest.approx(2 * 300 + 1 * 60 + 1 * 200)
    assert record.gpu_hours * 3600 == pytest.approx(300)
    assert record.memory_gib_hours * 3600 == pytest.approx(4 * 300 + 2 * (60 + 200))
    assert (record.waited_s, record.ran_s) == (0.0, 300.0)
    assert record.leader_exit == 0 and record.worker_exits == ((None, 1),)  # killed at the end
    assert record.nodes == ("n1", "n2") and record.restarts == 1 and record.pods == 2
    assert record.outcome == "Completed"
    # The worker's process, still stopping, adds nothing after the job's end; its end (143:
    # SIGTERM) is written into the record.
    (again,) = written(report(worker.name, PodState.KILLED, 420.0, code=143), c)
    assert job.cpu_core_s == pytest.approx(860)
    assert again.cpu_core_hours == record.cpu_core_hours and again.end_time == record.end_time
    assert again.worker_exits == ((143, 1),)
    assert again.pod_exits == (PodExit("acct-learner", 0), PodExit("acct-actors-0", 143, "SIGTERM"))


class Clock:
    """Clock: the server's time, moved by the test."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_history_is_listed_filtered_and_outlives_delete(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = Clock(1_700_000_000.0)
    config = dataclasses.replace(FAST, listen="127.0.0.1:0", data_dir=tmp_path)
    server = ArrangerServer(config, clock=clock)
    async with (
        bare_server(tmp_path, server=server),
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        ids = []
        for i, name in enumerate(("one", "two", "three")):
            ids.append((await client.submit(job_spec(name, leader=["true"]))).metadata.id)
            clock.now += 100
            await client.stop(name)  # a bare server runs nothing: it ends at once
            clock.now += 100 * i
        records = await client.history()
        assert [r.id for r in records] == ids
        first, me = records[0], server.local.user  # every caller of an insecure server
        assert (first.stage, first.reason, first.stopped_by) == ("Succeeded", "Stopped", me)
        assert first.waited_seconds == pytest.approx(100) and first.ran_seconds == 0
        assert not first.HasField("start_time") and not first.HasField("leader_exit_code")
        assert first.owner == me and first.queue == "default" and first.priority == 5
        await client.delete("one")  # gone from the live view, not from history
        assert [r.id for r in await client.history()] == ids
        second_end = records[1].end_time.ToNanoseconds() / 1e9
        assert [r.name for r in await client.history(since=second_end)] == ["two", "three"]
        assert [r.name for r in await client.history(until=second_end)] == ["one"]
        assert await client.history(user="someone-else") == []
        assert await client.history(queue="other") == []
        assert [r.name for r in await client.history(name="three")] == ["three"]
        paged = [r.id async for r in client.iter_history(page_size=1)]
        assert paged == ids
        address = f"127.0.0.1:{server.port}"
        code = await asyncio.to_thread(cli.main, ["--server", address, "history", "-o", "csv"])
        assert code == 0
        rows = list(csv.DictReader(io.StringIO(printed(capsys))))
        assert [r["name"] for r in rows] == ["one", "two", "three"]
        assert rows[0]["reason"] == "Stopped" and rows[0]["stopped_by"] == me
        code = await asyncio.to_thread(
            cli.main, ["--server", address, "history", "--user", me, "-o", "json"]
        )
        assert code == 0 and len(json.loads(printed(capsys))) == 3


def test_times_are_iso_dates_or_ages() -> None:
    now = 1_000_000.0
    assert parse_when("7d", now) == now - 7 * 86400
    assert parse_when("90s", now) == now - 90 and parse_when("2w", now) == now - 14 * 86400
    assert parse_when("1970-01-02T00:00:00+00:00", now) == 86400
    with pytest.raises(ValueError, match="not a time"):
        parse_when("yesterday", now)
