"""rollback puts memory back as the store holds it after a write that failed.

Every change mutates the controller's records first and is then written; a write that fails
(a full disk, a store that was removed) must leave nothing of the change in memory, or memory
would run ahead of the store: a job shown Succeeded whose processes run on, orders that no
restart would remember. The records a change touched are exactly those its Effects name, and
before it the store held them as memory did, so reading them back from the store and copying
them into the same objects (so that references held elsewhere stay valid) undoes it. Records
the store never held (a job being submitted, a node registering for the first time, a worker
a scale adds) are forgotten; jobs the change removed from memory come back. What only memory
keeps (whether a node's agent is connected, when it was last heard from, its usage, its GPU
sharing) is left as it is.

A store that cannot be read back either is marked broken: the server takes no more changes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import structlog

from arranger.server.controller import Controller
from arranger.server.convert import spec_from_json
from arranger.server.effects import Effects
from arranger.server.store import Store, StoredRecords, StoreError

log = structlog.get_logger("arranger.server")

_NODE_MEMORY_ONLY = frozenset(
    {"connected", "last_seen", "cpu_percent", "memory_used_bytes", "gpu_sharing", "shares_held"}
)


async def put_back(
    store: Store, controller: Controller, fx: Effects, error: StoreError
) -> set[str]:
    """put_back puts the records `fx` touched back as `store` holds them, after a write of
    `fx` failed with `error`: nothing of a change that was not stored stays in memory. It
    returns the jobs `fx` submitted that the store holds all the same: the transaction
    committed and only its answer was lost (a connection that broke at COMMIT)."""
    log.error("a change was not stored: memory is put back as the store holds it", error=str(error))
    try:
        stored = await store.read_records(
            fx.jobs | set(fx.removed),
            fx.pods,
            fx.nodes,
            fx.queues | fx.removed_queues,
            spec_from_json,
        )
    except Exception:
        log.exception("cannot read the store back: the server stops taking changes")
        store.broken = store.broken or f"cannot read the store back: {error}"
        return set()
    roll_back(controller, fx, stored)
    submitted = {e.job_id for e in fx.events if e.kind == "Submitted"}
    return submitted.intersection(stored.jobs)


def roll_back(controller: Controller, fx: Effects, stored: StoredRecords) -> None:
    """roll_back undoes in memory what `fx` changed, from the store's copy of its records."""
    view = controller.view
    for job_id, job in fx.removed.items():
        if job_id in stored.jobs and view.job(job_id) is None:
            controller.put_back_job(job)
    for job_id in fx.jobs | set(fx.removed):
        current = view.job(job_id)
        if current is None:
            continue
        job, old = current, stored.jobs.get(job_id)
        if old is None:
            controller.withdraw(job)  # never stored: as if never submitted
            continue
        _copy(old, job, skip={"pods"})
        controller.hold_as_stored(job)
        if job.deleted:
            controller.forget_name(job)
        else:
            controller.remember_name(job)
    for uid in fx.pods:
        found = view.pod(uid)
        if found is None:
            continue
        if uid in stored.pods:
            _copy(stored.pods[uid], found[1])
        elif found[0].id in stored.jobs:
            del found[0].pods[found[1].name]  # a worker the change added (scaling up)
    for name in fx.nodes:
        node = view.node(name)
        if node is None:
            continue
        if name in stored.nodes:
            _copy(stored.nodes[name], node, skip=_NODE_MEMORY_ONLY)
        else:
            controller.node_book.forget(name)  # it registered for the first time: not known yet
    for name in fx.queues | fx.removed_queues:
        controller.put_back_queue(name, stored.queues.get(name))


def _copy(source: Any, target: Any, skip: frozenset[str] | set[str] = frozenset()) -> None:
    for f in dataclasses.fields(source):
        if f.name not in skip:
            setattr(target, f.name, getattr(source, f.name))
