"""rows: records as rows of named columns, the same for every backend, and back.

A row is a dict from column name to a value every SQL engine stores as it is (text, integer,
real, NULL): enums as their values, booleans as 0/1, nested values as JSON text. A record is
turned into a row at the moment of its change, so that later changes to the record cannot leak
into a write still queued. Columns are named here once; a backend builds its statements from
these names and never from positions.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

from arranger.sched import GpuShare
from arranger.server.model import EventRecord, GpuRecord, JobRecord, NodeRecord, PodRecord
from arranger.server.queues import QueueRecord
from arranger.server.store.experiment_rows import EXPERIMENT_COLUMNS
from arranger.server.store.history_rows import HISTORY_COLUMNS, KEPT_IF_NULL
from arranger.spec import JobSpec
from arranger.states import NodeState, PodState, Role, ScheduleState, Stage

Row = dict[str, Any]


class RowLike(Protocol):
    """RowLike: a row as a driver returns it, read by column name."""

    def __getitem__(self, column: str, /) -> Any: ...


JOB_COLUMNS = (
    "id",
    "name",
    "queue",
    "spec",
    "stage",
    "schedule_state",
    "reason",
    "message",
    "submit_time",
    "start_time",
    "finish_time",
    "leader_restarts",
    "set_restarts",
    "terminating",
    "deleted",
    "infeasible_since",
    "leader_address",
    "waiting_since",
    "owner",
    "stopped_by",
    "nodes_used",
    "cpu_core_s",
    "memory_gib_s",
    "gpu_s",
    "package",
    "checkpoint_time",
    "experiment",
    "retries",
)
POD_COLUMNS = (
    "uid",
    "job_id",
    "name",
    "role",
    "worker_set",
    "idx",
    "rank",
    "in_minimum",
    "state",
    "attempt",
    "node",
    "gpus",
    "exit_code",
    "reason",
    "pid",
    "ports",
    "start_time",
    "finish_time",
    "not_before",
    "stopping",
    "requeue",
    "done",
    "held_since",
)
NODE_COLUMNS = (
    "name",
    "address",
    "cpu_milli",
    "memory_bytes",
    "gpus",
    "labels",
    "state",
    "cordoned",
    "agent_version",
    "runtimes",
    "agent_id",
)
QUEUE_COLUMNS = (
    "name",
    "weight",
    "cpu_milli",
    "memory_bytes",
    "gpu_milli",
    "machine_groups",
    "users",
    "max_priority",
    "allow_non_preemptible",
    "min_run_s",
    "idle_gpu_stop_s",
)
EVENT_COLUMNS = ("time", "kind", "job_id", "job_name", "pod", "message")
NO_EVENT_ID = 2**63 - 1  # above every event's id (a signed 64-bit row id): "before" the newest
TABLES: dict[str, tuple[str, ...]] = {
    "jobs": JOB_COLUMNS,
    "pods": POD_COLUMNS,
    "nodes": NODE_COLUMNS,
    "queues": QUEUE_COLUMNS,
    "history": HISTORY_COLUMNS,
    "experiments": EXPERIMENT_COLUMNS,
}


def upsert_sql(table: str, mark: Callable[[str], str]) -> str:
    """upsert_sql: the statement that writes a row of `table` in place, with `mark(column)` as
    each value's placeholder (SQLite's :name, psycopg's %(name)s). Not a delete and insert: a
    deleted job row would take its pods with it."""
    columns = TABLES[table]
    updates = ", ".join(
        f"{c} = COALESCE(excluded.{c}, {table}.{c})"
        if table == "history" and c in KEPT_IF_NULL
        else f"{c} = excluded.{c}"
        for c in columns[1:]
    )
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) "
        f"VALUES ({', '.join(mark(c) for c in columns)}) "
        f"ON CONFLICT ({columns[0]}) DO UPDATE SET {updates}"
    )


def insert_sql(table: str, columns: tuple[str, ...], mark: Callable[[str], str]) -> str:
    """insert_sql: the statement that appends a row of these columns to `table`."""
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(map(mark, columns))})"


def job_row(job: JobRecord) -> Row:
    return {
        "id": job.id,
        "name": job.name,
        "queue": job.spec.queue,
        "spec": job.spec_json,
        "stage": job.stage.value,
        "schedule_state": job.schedule_state.value,
        "reason": job.reason,
        "message": job.message,
        "submit_time": job.submit_time,
        "start_time": job.start_time,
        "finish_time": job.finish_time,
        "leader_restarts": job.leader_restarts,
        "set_restarts": json.dumps(job.set_restarts),
        "terminating": int(job.terminating),
        "deleted": int(job.deleted),
        "infeasible_since": job.infeasible_since,
        "leader_address": job.leader_address,
        "waiting_since": job.waiting_since,
        "owner": job.owner,
        "stopped_by": job.stopped_by,
        "nodes_used": json.dumps(job.nodes_used),
        "cpu_core_s": job.cpu_core_s,
        "memory_gib_s": job.memory_gib_s,
        "gpu_s": job.gpu_s,
        "package": job.spec.package.sha256 if job.spec.package else "",
        "checkpoint_time": job.checkpoint_time,
        "experiment": job.experiment,
        "retries": json.dumps(job.retries),
    }


def job_from(row: RowLike, spec: JobSpec) -> JobRecord:
    return JobRecord(
        id=row["id"],
        spec=spec,
        spec_json=row["spec"],
        stage=Stage(row["stage"]),
        schedule_state=ScheduleState(row["schedule_state"]),
        reason=row["reason"],
        message=row["message"],
        submit_time=row["submit_time"],
        start_time=row["start_time"],
        finish_time=row["finish_time"],
        leader_restarts=row["leader_restarts"],
        set_restarts=json.loads(row["set_restarts"]),
        retries=json.loads(row["retries"]),
        terminating=bool(row["terminating"]),
        deleted=bool(row["deleted"]),
        infeasible_since=row["infeasible_since"],
        leader_address=row["leader_address"],
        waiting_since=row["waiting_since"],
        owner=row["owner"],
        stopped_by=row["stopped_by"],
        nodes_used=json.loads(row["nodes_used"]),
        cpu_core_s=row["cpu_core_s"],
        memory_gib_s=row["memory_gib_s"],
        gpu_s=row["gpu_s"],
        checkpoint_time=row["checkpoint_time"],
        experiment=row["experiment"],
    )


def pod_row(pod: PodRecord) -> Row:
    return {
        "uid": pod.uid,
        "job_id": pod.job_id,
        "name": pod.name,
        "role": pod.role.value,
        "worker_set": pod.worker_set,
        "idx": pod.index,
        "rank": pod.rank,
        "in_minimum": int(pod.in_minimum),
        "state": pod.state.value,
        "attempt": pod.attempt,
        "node": pod.node,
        "gpus": json.dumps([[g.index, g.milli] for g in pod.gpus]),
        "exit_code": pod.exit_code,
        "reason": pod.reason,
        "pid": pod.pid,
        "ports": json.dumps(pod.ports),
        "start_time": pod.start_time,
        "finish_time": pod.finish_time,
        "not_before": pod.not_before,
        "stopping": int(pod.stopping),
        "requeue": pod.requeue,
        "done": int(pod.done),
        "held_since": pod.held_since,
    }


def pod_from(row: RowLike) -> PodRecord:
    return PodRecord(
        uid=row["uid"],
        job_id=row["job_id"],
        name=row["name"],
        role=Role(row["role"]),
        worker_set=row["worker_set"],
        index=row["idx"],
        rank=row["rank"],
        in_minimum=bool(row["in_minimum"]),
        state=PodState(row["state"]),
        attempt=row["attempt"],
        node=row["node"],
        gpus=tuple(GpuShare(i, m) for i, m in json.loads(row["gpus"])),
        exit_code=row["exit_code"],
        reason=row["reason"],
        pid=row["pid"],
        ports=json.loads(row["ports"]),
        start_time=row["start_time"],
        finish_time=row["finish_time"],
        not_before=row["not_before"],
        stopping=bool(row["stopping"]),
        requeue=row["requeue"],
        done=bool(row["done"]),
        held_since=row["held_since"],
    )


def node_row(node: NodeRecord) -> Row:
    gpus = [[g.index, g.uuid, g.model, g.memory_bytes, g.fake] for g in node.gpus]
    return {
        "name": node.name,
        "address": node.address,
        "cpu_milli": node.cpu_milli,
        "memory_bytes": node.memory_bytes,
        "gpus": json.dumps(gpus),
        "labels": json.dumps(node.labels),
        "state": node.state.value,
        "cordoned": int(node.cordoned),
        "agent_version": node.agent_version,
        "runtimes": json.dumps(node.runtimes),
        "agent_id": node.agent_id,
    }


def node_from(row: RowLike) -> NodeRecord:
    return NodeRecord(
        name=row["name"],
        address=row["address"],
        cpu_milli=row["cpu_milli"],
        memory_bytes=row["memory_bytes"],
        gpus=[GpuRecord(*g) for g in json.loads(row["gpus"])],
        labels=json.loads(row["labels"]),
        state=NodeState(row["state"]),
        cordoned=bool(row["cordoned"]),
        agent_version=row["agent_version"],
        runtimes=json.loads(row["runtimes"]),
        agent_id=row["agent_id"],
    )


def queue_row(queue: QueueRecord) -> Row:
    return {
        "name": queue.name,
        "weight": queue.weight,
        "cpu_milli": queue.cpu_milli,
        "memory_bytes": queue.memory_bytes,
        "gpu_milli": queue.gpu_milli,
        "machine_groups": json.dumps(list(queue.machine_groups)),
        "users": json.dumps(list(queue.users)),
        "max_priority": queue.max_priority,
        "allow_non_preemptible": int(queue.allow_non_preemptible),
        "min_run_s": queue.min_run_s,
        "idle_gpu_stop_s": queue.idle_gpu_stop_s,
    }


def queue_from(row: RowLike) -> QueueRecord:
    return QueueRecord(
        name=row["name"],
        weight=row["weight"],
        cpu_milli=row["cpu_milli"],
        memory_bytes=row["memory_bytes"],
        gpu_milli=row["gpu_milli"],
        machine_groups=tuple(json.loads(row["machine_groups"])),
        users=tuple(json.loads(row["users"])),
        max_priority=row["max_priority"],
        allow_non_preemptible=bool(row["allow_non_preemptible"]),
        min_run_s=float(row["min_run_s"]),
        idle_gpu_stop_s=float(row["idle_gpu_stop_s"]),
    )


def event_row(event: EventRecord) -> Row:
    return {
        "time": event.time,
        "kind": event.kind,
        "job_id": event.job_id,
        "job_name": event.job_name,
        "pod": event.pod,
        "message": event.message,
    }


def event_from(row: RowLike) -> EventRecord:
    return EventRecord(
        time=row["time"],
        kind=row["kind"],
        message=row["message"],
        job_id=row["job_id"],
        job_name=row["job_name"],
        pod=row["pod"],
        seq=row["id"],
    )
