"""queues: a tenant's share of the cluster, as the server keeps it and as clients send it.

A queue has a weight (its deserved share is split by weight), an optional capability (a hard
cap per resource) and the private machine groups its jobs may use. It is also the unit of
policy: who may submit to it (default everyone), the highest priority its jobs may ask,
whether they may ask not to be preempted (default no), and how long its pods run before
preempt or reclaim may take them (`minRunSeconds`, default 0: no such shield). The queue
`default` always exists and cannot be deleted; a job must name a queue that exists.

A new cluster's `default` queue is DEFAULT: its users may ask no more than the default priority,
so that no one takes the top priority of the queue everyone shares and evicts the rest (admins
are not asked). It is written when the store is made, not by a migration: a cluster made before
keeps its default queue as its admin left it, and its server says at every start how to cap it
(UNCAPPED_DEFAULT).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from arranger.sched import NO_CAPABILITY, QueueInfo, Res
from arranger.sched.resources import UNLIMITED
from arranger.spec import DEFAULT_PRIORITY, DEFAULT_QUEUE, MAX_PRIORITY, MIN_PRIORITY
from arranger.v1 import arranger_pb2

MAX_WEIGHT = 1e6
MAX_GROUPS = 64
MAX_USERS = 1024
MAX_MIN_RUN_S = 7 * 86_400.0  # minRunSeconds: a week at most
_USER = re.compile(r"^[A-Za-z0-9_][-A-Za-z0-9_.@]{0,63}$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_GROUP = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class QueueInvalid(ValueError):
    """QueueInvalid says which field of a queue is wrong."""


@dataclass(frozen=True)
class QueueRecord:
    """QueueRecord: capability components are None where there is no cap."""

    name: str
    weight: float = 1.0
    cpu_milli: int | None = None
    memory_bytes: int | None = None
    gpu_milli: int | None = None
    machine_groups: tuple[str, ...] = ()
    users: tuple[str, ...] = ()  # who may submit; empty: everyone
    max_priority: int | None = None  # None: any priority
    allow_non_preemptible: bool = False
    min_run_s: float = 0.0  # its pods that ran less are not evicted by preempt or reclaim
    idle_gpu_stop_s: float = 0.0  # stop a job this long after its GPUs were found idle; 0: never

    def policy_problem(self, user: str, priority: int, preemptible: bool) -> str:
        """policy_problem: why a job of `user` with this priority and preemptibility may not
        enter this queue, naming the field ("" if it may). Admins are not asked."""
        if self.users and user not in self.users:
            return f"metadata.queue: user {user!r} may not submit to queue {self.name!r}"
        if self.max_priority is not None and priority > self.max_priority:
            return (
                f"spec.priority: {priority} is above the maximum priority of queue {self.name!r}: "
                f"{self.max_priority}"
            )
        if not preemptible and not self.allow_non_preemptible:
            return (
                f"spec.preemptible: queue {self.name!r} does not allow non-preemptible jobs "
                "(allowNonPreemptible)"
            )
        return ""

    def info(self, held_outside: Res) -> QueueInfo:
        cap = Res(
            UNLIMITED if self.cpu_milli is None else self.cpu_milli,
            UNLIMITED if self.memory_bytes is None else self.memory_bytes,
            UNLIMITED if self.gpu_milli is None else self.gpu_milli,
        )
        capped = cap != NO_CAPABILITY
        return QueueInfo(
            self.name,
            self.weight,
            cap if capped else NO_CAPABILITY,
            held_outside,
            frozenset(self.machine_groups),
            self.min_run_s,
        )


DEFAULT = QueueRecord(DEFAULT_QUEUE, max_priority=DEFAULT_PRIORITY)  # a new cluster's
UNCAPPED_DEFAULT = (
    f"queue {DEFAULT_QUEUE!r} has no maxPriority: any user may submit at priority up to "
    f"{MAX_PRIORITY} and so evict other users' jobs; a cluster made by this release caps it at "
    f"{DEFAULT_PRIORITY}: arranger queue update {DEFAULT_QUEUE} --max-priority {DEFAULT_PRIORITY}"
)


def uncapped_default(queues: Iterable[QueueRecord]) -> bool:
    """uncapped_default: whether the `default` queue lets its users ask any priority (the
    server then logs UNCAPPED_DEFAULT at start)."""
    return any(q.name == DEFAULT_QUEUE and q.max_priority is None for q in queues)


def parse_queue(msg: arranger_pb2.Queue) -> QueueRecord:
    """parse_queue checks a queue as a client sent it; status is ignored."""
    errors: list[str] = []
    if not msg.name or len(msg.name) > 63 or not _NAME.match(msg.name):
        errors.append("queue.name: must be 1-63 lowercase letters, digits and '-'")
    weight = msg.weight or 1.0
    if not math.isfinite(weight) or not 0 < weight <= MAX_WEIGHT:
        errors.append(f"queue.weight: must be above 0 and at most {MAX_WEIGHT:g}")
    cap = msg.capability
    cpu = memory = gpu = None
    if cap.HasField("cpu"):
        if not math.isfinite(cap.cpu) or cap.cpu < 0:
            errors.append("queue.capability.cpu: must be >= 0 cores")
        else:
            cpu = round(cap.cpu * 1000)
    if cap.HasField("memory"):
        if cap.memory < 0:
            errors.append("queue.capability.memory: must be >= 0 bytes")
        else:
            memory = cap.memory
    if cap.HasField("gpu"):
        if not math.isfinite(cap.gpu) or cap.gpu < 0:
            errors.append("queue.capability.gpu: must be >= 0")
        else:
            gpu = round(cap.gpu * 1000)
    groups = tuple(msg.machine_groups)
    if len(groups) > MAX_GROUPS:
        errors.append(f"queue.machineGroups: at most {MAX_GROUPS}")
    for i, group in enumerate(groups):
        if len(group) > 63 or not _GROUP.match(group):
            errors.append(f"queue.machineGroups[{i}]: {group[:40]!r} is not a label value")
    users = tuple(msg.users)
    if len(users) > MAX_USERS:
        errors.append(f"queue.users: at most {MAX_USERS}")
    for i, user in enumerate(users[:MAX_USERS]):
        if not _USER.match(user):
            errors.append(f"queue.users[{i}]: {user[:40]!r} is not a user name")
    max_priority = None
    if msg.HasField("max_priority"):
        if not MIN_PRIORITY <= msg.max_priority <= MAX_PRIORITY:
            errors.append(f"queue.maxPriority: must be {MIN_PRIORITY}..{MAX_PRIORITY}")
        max_priority = msg.max_priority
    min_run = msg.min_run_seconds or 0.0  # -0.0 too
    if not math.isfinite(min_run) or not 0 <= min_run <= MAX_MIN_RUN_S:
        errors.append(
            f"queue.minRunSeconds: must be 0..{MAX_MIN_RUN_S:.0f} seconds (0: off; at most 7 days)"
        )
    idle_stop = msg.idle_gpu_stop_minutes or 0.0
    if not math.isfinite(idle_stop) or not 0 <= idle_stop <= MAX_MIN_RUN_S / 60:
        errors.append(
            f"queue.idleGpuStopMinutes: must be 0..{MAX_MIN_RUN_S / 60:.0f} minutes (0: never)"
        )
    if errors:
        raise QueueInvalid("; ".join(errors))
    return QueueRecord(
        msg.name,
        weight,
        cpu,
        memory,
        gpu,
        tuple(sorted(set(groups))),
        tuple(sorted(set(users))),
        max_priority,
        msg.allow_non_preemptible,
        min_run,
        idle_stop * 60,
    )


def queue_to_proto(queue: QueueRecord) -> arranger_pb2.Queue:
    msg = arranger_pb2.Queue(
        name=queue.name,
        weight=queue.weight,
        machine_groups=queue.machine_groups,
        users=queue.users,
        allow_non_preemptible=queue.allow_non_preemptible,
        min_run_seconds=queue.min_run_s,
        idle_gpu_stop_minutes=queue.idle_gpu_stop_s / 60,
    )
    if queue.max_priority is not None:
        msg.max_priority = queue.max_priority
    if queue.cpu_milli is not None:
        msg.capability.cpu = queue.cpu_milli / 1000
    if queue.memory_bytes is not None:
        msg.capability.memory = queue.memory_bytes
    if queue.gpu_milli is not None:
        msg.capability.gpu = queue.gpu_milli / 1000
    return msg
