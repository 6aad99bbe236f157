"""sql: what the SQL backends (sqlite, postgres) share beyond the rows: the statements of a new
cluster, of pruning and of package ownership, with each backend's placeholder; the check of a
store's schema version; a package file read in rows; loaded pods put in their jobs.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from arranger.server.model import JobRecord, PodRecord
from arranger.server.queues import DEFAULT
from arranger.server.store.base import PACKAGE_CHUNK_BYTES, PACKAGE_CHUNKS_PER_WRITE

# NEW_CLUSTER: what a store gets in the transaction that makes it, beyond its migrations: the
# default queue's cap (queues.DEFAULT). Never a migration's: that would change the policy of
# an existing cluster behind its admin's back.
NEW_CLUSTER = (
    f"UPDATE queues SET max_priority = {DEFAULT.max_priority} WHERE name = '{DEFAULT.name}';"
)


def report_statements(mark: str) -> tuple[str, str, str]:
    """report_statements: the deletion of a reported point (job, key, step), the writing of
    one (job, key, step, value), the writing of a note (job, key, text): in the order a
    batch's rows are written (Batch.report_rows)."""
    point = (
        f"INSERT INTO report_points (job_id, key, step, value) VALUES ({mark}, {mark}, {mark}, "
        f"{mark}) ON CONFLICT (job_id, key, step) DO UPDATE SET value = excluded.value"
    )
    gone = f"DELETE FROM report_points WHERE job_id = {mark} AND key = {mark} AND step = {mark}"
    note = (
        f"INSERT INTO report_notes (job_id, key, text) VALUES ({mark}, {mark}, {mark}) "
        "ON CONFLICT (job_id, key) DO UPDATE SET text = excluded.text"
    )
    return gone, point, note


def orphan_experiment(mark: str) -> str:
    """orphan_experiment: the deletion of an experiment (its id twice) once none of its
    members' rows is left: it goes with the last of them. `experiment <> ''` lets the
    partial index on jobs.experiment answer."""
    return (
        f"DELETE FROM experiments WHERE id = {mark} AND NOT EXISTS "
        f"(SELECT 1 FROM jobs WHERE experiment = {mark} AND experiment <> '')"
    )


def version_problem(where: str, version: int, known: int, migrate: bool) -> str:
    """version_problem: why a store at schema `version` cannot be used by this arranger, which
    knows `known` versions ("" if it can: the same, or older and `migrate` brings it on)."""
    if version > known:
        return (
            f"store {where} has schema version {version}; this arranger knows up to {known}: "
            "upgrade arranger"
        )
    if version < known and not migrate:
        return f"the store at {where} is older than this arranger: start the server first"
    return ""


def prune_statements(mark: str) -> tuple[str, str]:
    """prune_statements: the deletions of a pruning's bounded batches, with `mark` as each
    value's placeholder: events of no job in the store older than a time, then history
    records that ended before one (each takes the time and PRUNE_BATCH)."""
    events = (
        f"DELETE FROM events WHERE id IN (SELECT id FROM events WHERE time < {mark} AND "
        f"(job_id = '' OR job_id NOT IN (SELECT id FROM jobs)) ORDER BY id LIMIT {mark})"
    )
    history = (
        f"DELETE FROM history WHERE id IN (SELECT id FROM history WHERE end_time < {mark} "
        f"ORDER BY end_time LIMIT {mark})"
    )
    return events, history


def prune_package_statements(mark: str) -> tuple[str, str]:
    """prune_package_statements: the deletions of packages no job in the store refers to:
    one of a given hash, then those last uploaded or asked for before a time (its chunks go with each, ON DELETE CASCADE)."""
    unused = "sha256 NOT IN (SELECT package FROM jobs WHERE package <> '')"
    listed = f"DELETE FROM packages WHERE sha256 = {mark} AND {unused}"
    old = f"DELETE FROM packages WHERE touched < {mark} AND {unused}"
    return listed, old


def owned_by(mark: str) -> str:
    """owned_by: the condition that a package row is owned by the user `mark` stands for."""
    return f"sha256 IN (SELECT sha256 FROM package_owners WHERE owner = {mark})"


def read_chunks(path: Path, first: int) -> list[bytes]:
    """read_chunks: up to PACKAGE_CHUNKS_PER_WRITE rows of the package file at `path`, from
    row `first` (empty past its end)."""
    found = []
    with open(path, "rb") as f:
        f.seek(first * PACKAGE_CHUNK_BYTES)
        for _ in range(PACKAGE_CHUNKS_PER_WRITE):
            data = f.read(PACKAGE_CHUNK_BYTES)
            if not data:
                break
            found.append(data)
    return found


def sorted_pods(jobs: dict[str, JobRecord], pods: Iterable[PodRecord]) -> list[JobRecord]:
    """sorted_pods gives each job its pods (those of jobs not in `jobs` are dropped), the
    leader first, then workers by rank, and returns the jobs."""
    for pod in pods:
        job = jobs.get(pod.job_id)
        if job is not None:
            job.pods[pod.name] = pod
    for job in jobs.values():
        job.pods = dict(sorted(job.pods.items(), key=lambda item: item[1].rank))
    return list(jobs.values())
