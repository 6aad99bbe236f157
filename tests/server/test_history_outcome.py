"""Every job that started, or was stopped, deleted or failed before it started, has a history
record with its outcome (Completed, Failed, Stopped, Deleted) and each pod's exit code and
signal; records of the previous release's store are given an outcome when it is migrated."""

from __future__ import annotations

import io
import sqlite3
from pathlib import Path

from rich.console import Console

from arranger.client.history import exits_text, history_table, outcome_beside_stage, write_csv
from arranger.client.specfile import load_job_yaml
from arranger.client.text import as_dict
from arranger.sched import JobDecision, Placement, Plan
from arranger.server.controller import Controller, ControllerConfig
from arranger.server.convert import history_to_proto, job_summary, job_to_proto, spec_to_json
from arranger.server.effects import Effects
from arranger.server.history import MAX_POD_EXITS, HistoryRecord, PodExit, records_to_write
from arranger.server.model import JobRecord
from arranger.server.nodes import NodeRegistration, PodReport
from arranger.server.store import HistoryQuery
from arranger.server.store.sqlite import SqliteStore
from arranger.server.validation import parse_job
from arranger.states import PodState, ScheduleState
from tests.server.test_store_upgrade import PREVIOUS, copy_fixture

SPEC = """
metadata: {name: out}
spec:
  leader: {name: learner, template: {command: [l], resources: {cpu: 1, memory: 1Gi}}}
  workerSets: [{name: actors, counts: 2, template: {command: [a], resources: {cpu: 1, memory: 1Gi}}}]
"""


def submitted(c: Controller, job_id: str = "j") -> JobRecord:
    c.node_registered(NodeRegistration("n1", "10.0.0.1", 8000, 2**34), 100.0)
    spec = parse_job(load_job_yaml(SPEC))
    job, _ = c.submit(job_id, spec, spec_to_json(spec), 100.0, owner="ann")
    return job


def written(fx: Effects, c: Controller) -> list[HistoryRecord]:
    """written: the history records the write of `fx` stores."""
    return records_to_write(fx.history, fx.rerecord, lambda j: c.view.job(j) or fx.removed.get(j))


def report(
    c: Controller, job: JobRecord, pod: str, state: PodState, now: float, code: int | None = None
) -> Effects:
    p = job.pods[pod]
    ports = {"rpc": 7000} if pod == job.leader.name else {}
    return c.pod_reports(p.node, [PodReport(p.uid, p.attempt, state, 1, code, ports=ports)], now)


def running(c: Controller) -> JobRecord:
    """running: a job whose leader and workers all run on n1 since 100."""
    job = submitted(c)
    placed = [Placement("j", p.name, "n1") for p in job.pods.values()]
    c.apply_plan(Plan(placed, {"j": JobDecision("j", ScheduleState.SCHEDULED_SUCCEED)}), 100.0)
    for pod in job.pods:
        report(c, job, pod, PodState.RUNNING, 100.0)
    return job


def test_a_job_deleted_while_running_keeps_a_record_with_its_pods_signals() -> None:
    c = Controller(ControllerConfig())
    job = running(c)
    assert job.stage.value == "Running"
    (record,) = c.delete(job, 200.0).history
    assert (record.outcome, record.stage, record.reason) == ("Deleted", "Running", "Deleted")
    assert record.end_time == 200.0 and record.ran_s == 100.0
    assert record.cpu_core_hours * 3600 == 3 * 100.0  # not counted past the delete
    learner, a0, a1 = (p.name for p in job.pods.values())
    assert record.pod_exits == (PodExit(learner, None), PodExit(a0, None), PodExit(a1, None))
    report(c, job, a0, PodState.KILLED, 210.0, code=143)
    report(c, job, a1, PodState.KILLED, 215.0, code=137)
    (last,) = written(report(c, job, learner, PodState.KILLED, 220.0, code=143), c)
    assert last.outcome == "Deleted" and last.cpu_core_hours == record.cpu_core_hours
    assert last.pod_exits == (
        PodExit(learner, 143, "SIGTERM"),
        PodExit(a0, 143, "SIGTERM"),
        PodExit(a1, 137, "SIGKILL"),
    )
    shown = history_to_proto(last)
    assert exits_text(shown) == "143(SIGTERM); 1x137(SIGKILL) 1x143(SIGTERM)"
    assert [e.signal for e in shown.pod_exits] == ["SIGTERM", "SIGTERM", "SIGKILL"]


def test_a_job_stopped_while_pending_and_one_failed_before_starting_have_records() -> None:
    c = Controller(ControllerConfig())
    job = submitted(c)
    (stopped,) = c.stop(job, 150.0, by="ann").history
    assert (stopped.stage, stopped.reason, stopped.outcome) == ("Succeeded", "Stopped", "Stopped")
    assert stopped.start_time is None and stopped.waited_s == 50.0
    assert job_to_proto(job).status.outcome == "Stopped"
    assert job_summary(job).progress.outcome == "Stopped"
    other = submitted(c, "k")
    assert job_summary(other).progress.outcome == ""  # not ended
    fx = c.apply_plan(Plan([], {"k": JobDecision("k", ScheduleState.SCHEDULED_FAILED)}), 160.0)
    (failed,) = fx.history
    assert (failed.stage, failed.outcome, failed.start_time) == ("Failed", "Failed", None)
    assert failed.pod_exits == tuple(PodExit(p.name, None) for p in other.pods.values())


def test_a_job_whose_leader_succeeded_completed_and_a_deleted_finished_job_keeps_that() -> None:
    c = Controller(ControllerConfig())
    job = running(c)
    (record,) = report(c, job, job.leader.name, PodState.SUCCEEDED, 300.0, code=0).history
    assert record.outcome == "Completed"
    assert not c.delete(job, 310.0).history  # it has its record
    (again,) = written(report(c, job, "out-actors-0", PodState.KILLED, 320.0, code=143), c)
    assert (again.outcome, again.stage, again.reason) == (
        "Completed",
        "Succeeded",
        "LeaderSucceeded",
    )


def test_history_shows_outcome_beside_stage_and_readable_exits() -> None:
    record = HistoryRecord(
        "j",
        "out",
        "ann",
        "default",
        5,
        100.0,
        110.0,
        200.0,
        "Succeeded",
        "Stopped",
        "",
        "ann",
        143,
        ((0, 3), (143, 1), (None, 2)),
        ("n1",),
        7,
        0,
        1.0,
        0.0,
        1.0,
        outcome="Stopped",
        pod_exits=(PodExit("out-learner", 143, "SIGTERM"), PodExit("out-actors-0", None)),
    )
    msg = history_to_proto(record)
    assert exits_text(msg) == "143(SIGTERM); 3x0 1x143(SIGTERM) 2xnone"
    keys = list(outcome_beside_stage(as_dict(msg)))
    assert keys[keys.index("stage") + 1] == "outcome"
    out = io.StringIO()
    write_csv([msg], out)
    header, row = out.getvalue().splitlines()
    cells = dict(zip(header.split(","), row.split(","), strict=True))
    assert cells["stage"] == "Succeeded" and cells["outcome"] == "Stopped"
    assert cells["pod_exit_codes"] == "out-learner=143(SIGTERM) out-actors-0=none"
    console = Console(file=io.StringIO(), width=300)
    console.print(history_table([msg]))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "OUTCOME" in text and "Stopped" in text and "143(SIGTERM); 3x0" in text


async def test_records_of_the_previous_release_are_given_an_outcome(tmp_path: Path) -> None:
    data = copy_fixture(tmp_path, PREVIOUS)
    with sqlite3.connect(data / "arranger.db") as db:  # as the previous release wrote them
        for job_id, stage, reason in (
            ("a", "Succeeded", "LeaderSucceeded"),
            ("b", "Succeeded", "Stopped"),
            ("c", "Failed", "LeaderFailed"),
        ):
            db.execute(
                "INSERT INTO history VALUES (?, 'n', 'o', 'default', 5, 1.0, 2.0, 3.0, 1.0, 1.0,"
                " ?, ?, '', '', 143, '[[143, 1]]', '[]', 2, 0, 0.1, 0.0, 0.1,"
                " NULL, NULL, NULL, NULL, NULL)",
                (job_id, stage, reason),
            )
    store = await SqliteStore.open(data / "arranger.db")
    try:
        records = await store.history(HistoryQuery(limit=10))
    finally:
        await store.close()
    by_id = {r.job_id: r for r in records if r.job_id in "abc"}
    assert {k: r.outcome for k, r in by_id.items()} == {
        "a": "Completed",
        "b": "Stopped",
        "c": "Failed",
    }
    assert by_id["c"].pod_exits == () and by_id["c"].worker_exits == ((143, 1),)


def test_a_large_job_deleted_while_running_is_recorded_once_per_write_and_bounded() -> None:
    """Its pods' ends, however many in one report, make one record for the write, as the job
    is then; the record keeps the leader's exit and the failed workers' first, at most
    MAX_POD_EXITS, while the counts by code cover every worker."""
    c = Controller(ControllerConfig())
    c.node_registered(NodeRegistration("n1", "10.0.0.1", 2**20, 2**40), 100.0)
    big = SPEC.replace("counts: 2", "counts: 300").replace("cpu: 1,", "cpu: 10m,")
    spec = parse_job(load_job_yaml(big))
    job, _ = c.submit("j", spec, spec_to_json(spec), 100.0, owner="ann")
    placed = [Placement("j", p.name, "n1") for p in job.pods.values()]
    c.apply_plan(Plan(placed, {"j": JobDecision("j", ScheduleState.SCHEDULED_SUCCEED)}), 100.0)
    for pod in job.pods:  # the leader first: the workers launch once it runs
        report(c, job, pod, PodState.RUNNING, 100.0)
    c.delete(job, 200.0)
    ends = [
        PodReport(p.uid, p.attempt, PodState.KILLED, 1, 1 if i == 299 else 0)
        for i, p in enumerate(job.workers())
    ]
    fx = c.pod_reports("n1", ends, 210.0)
    assert not fx.history and fx.rerecord == {"j"}  # nothing built per pod
    (record,) = written(fx, c)
    assert len(record.pod_exits) == MAX_POD_EXITS
    assert record.pod_exits[0].pod == job.leader.name
    assert record.pod_exits[1] == PodExit("out-actors-299", 1, "")
    assert dict(record.worker_exits) == {0: 299, 1: 1}


def test_a_delete_writes_every_pod_it_charged() -> None:
    """Usage is counted up to the delete for every pod: each is written with it, so that a
    restart does not count a stopping pod's time again when its end comes."""
    c = Controller(ControllerConfig())
    job = running(c)
    c.scale(job, "actors", 1, 150.0, "ann")  # out-actors-1 is stopping: it is killed already
    assert job.pods["out-actors-1"].stopping
    fx = c.delete(job, 200.0)
    assert fx.pods == {p.uid for p in job.pods.values()}
    assert all(p.held_since is None for p in job.pods.values())
