"""cluster holds Snapshot, the frozen view of the cluster one scheduling cycle works on, with
what a caller keeps from cycle to cycle so that a cycle need not build it (node arrays, the
jobs' index) and the workload MinFragment places against."""

from __future__ import annotations

from dataclasses import dataclass, field

from arranger.sched.fragmentation import RequestMix
from arranger.sched.nodes import NodeArrays
from arranger.sched.plan import Claim, Reservation
from arranger.sched.snapshot import JobIndex, JobInfo, NodeInfo, QueueInfo


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Snapshot is one consistent cluster: nodes, queues, and every job that holds resources
    or waits for them. `reservation` is what the last cycle locked for a starving job, and
    `claims` the room its evictions are freeing for waiting jobs (see Claim).
    `request_mix` is the workload MinFragment places against (None: the snapshot's own pods).

    A job whose queue is not listed draws on a queue of weight 1 without a capability.

    `arrays` and `index`, when given, must equal `NodeArrays(nodes)` and
    `index_jobs(jobs, queues)`: a caller that keeps them from change to change passes them so
    that a cycle need not build them from every node and job (a cycle copies the usage in
    `arrays` and shares the rest: no one may change them afterwards). They take no part in
    comparing snapshots.
    """

    now: float
    nodes: tuple[NodeInfo, ...]
    jobs: tuple[JobInfo, ...]
    queues: tuple[QueueInfo, ...] = ()
    reservation: Reservation | None = None
    request_mix: RequestMix | None = None
    claims: tuple[Claim, ...] = ()
    arrays: NodeArrays | None = field(default=None, compare=False, repr=False)
    index: JobIndex | None = field(default=None, compare=False, repr=False)
