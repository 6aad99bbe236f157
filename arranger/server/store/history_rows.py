"""history_rows: the accounting records of ended jobs (arranger.server.history) as rows of
the `history` table, and back (see rows for what a row is)."""

from __future__ import annotations

import json
from typing import Any

from arranger.server.history import HistoryRecord, PodExit

Row = dict[str, Any]

HISTORY_COLUMNS = (
    "id",
    "name",
    "owner",
    "queue",
    "priority",
    "submit_time",
    "start_time",
    "end_time",
    "waited_s",
    "ran_s",
    "stage",
    "reason",
    "message",
    "stopped_by",
    "leader_exit",
    "worker_exits",
    "nodes",
    "pods",
    "restarts",
    "cpu_core_hours",
    "gpu_hours",
    "memory_gib_hours",
    "avg_cpu_cores",
    "peak_cpu_cores",
    "peak_memory_bytes",
    "avg_gpu_utilization",
    "peak_gpu_memory_bytes",
    "outcome",
    "pod_exits",
    "experiment",
)
# A history record is written again as its job's pods end (their exit codes): the figures
# from usage samples, known only when it was first written, are kept where the new one has none.
_SAMPLED = slice(HISTORY_COLUMNS.index("avg_cpu_cores"), HISTORY_COLUMNS.index("outcome"))
KEPT_IF_NULL = frozenset(HISTORY_COLUMNS[_SAMPLED])


# Each kept table, its columns and its key (the first column): what upserts are built from.
def history_row(r: HistoryRecord) -> Row:
    return {
        "id": r.job_id,
        "name": r.name,
        "owner": r.owner,
        "queue": r.queue,
        "priority": r.priority,
        "submit_time": r.submit_time,
        "start_time": r.start_time,
        "end_time": r.end_time,
        "waited_s": r.waited_s,
        "ran_s": r.ran_s,
        "stage": r.stage,
        "reason": r.reason,
        "message": r.message,
        "stopped_by": r.stopped_by,
        "leader_exit": r.leader_exit,
        "worker_exits": json.dumps(r.worker_exits),
        "nodes": json.dumps(r.nodes),
        "pods": r.pods,
        "restarts": r.restarts,
        "cpu_core_hours": r.cpu_core_hours,
        "gpu_hours": r.gpu_hours,
        "memory_gib_hours": r.memory_gib_hours,
        "avg_cpu_cores": r.avg_cpu_cores,
        "peak_cpu_cores": r.peak_cpu_cores,
        "peak_memory_bytes": r.peak_memory_bytes,
        "avg_gpu_utilization": r.avg_gpu_utilization,
        "peak_gpu_memory_bytes": r.peak_gpu_memory_bytes,
        "outcome": r.outcome,
        "pod_exits": json.dumps([[e.pod, e.exit_code, e.signal] for e in r.pod_exits]),
        "experiment": r.experiment,
    }


def history_from(row: Any) -> HistoryRecord:
    return HistoryRecord(
        job_id=row["id"],
        name=row["name"],
        owner=row["owner"],
        queue=row["queue"],
        priority=row["priority"],
        submit_time=row["submit_time"],
        start_time=row["start_time"],
        end_time=row["end_time"],
        stage=row["stage"],
        reason=row["reason"],
        message=row["message"],
        stopped_by=row["stopped_by"],
        leader_exit=row["leader_exit"],
        worker_exits=tuple((code, count) for code, count in json.loads(row["worker_exits"])),
        nodes=tuple(json.loads(row["nodes"])),
        pods=row["pods"],
        restarts=row["restarts"],
        cpu_core_hours=row["cpu_core_hours"],
        gpu_hours=row["gpu_hours"],
        memory_gib_hours=row["memory_gib_hours"],
        avg_cpu_cores=row["avg_cpu_cores"],
        peak_cpu_cores=row["peak_cpu_cores"],
        peak_memory_bytes=row["peak_memory_bytes"],
        avg_gpu_utilization=row["avg_gpu_utilization"],
        peak_gpu_memory_bytes=row["peak_gpu_memory_bytes"],
        outcome=row["outcome"],
        pod_exits=tuple(PodExit(*exit) for exit in json.loads(row["pod_exits"])),
        experiment=row["experiment"],
    )
