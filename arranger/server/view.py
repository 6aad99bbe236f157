"""view: the read side of the controller, for everything outside it that looks at its records.

The controller changes its records only when a stimulus comes in (submit, delete, a node
registering, a cordon...). Everything else reads them through a ClusterView: the API's replies,
the commit that stores what a change touched, the news watchers get, retention, the plan
re-check, the dashboard and the metrics. A view holds the controller's own mappings, so it
always shows the records as they are now; it returns the records themselves (no copies, no
protobuf), which callers read and never change. Nothing in it costs more than what it returns,
save where its docstring says it walks every job.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from arranger.sched import Res
from arranger.server.listing import JobOrder, Key, key_of
from arranger.server.model import ExperimentRecord, JobRecord, NodeRecord, PodRecord
from arranger.server.queues import QueueRecord


@dataclass(frozen=True)
class HeldOn:
    """HeldOn: what the pods on a node hold now: in all, how many they are, and the
    thousandths of each GPU (by index) each job holds (by job name)."""

    res: Res
    pods: int
    gpus: dict[int, dict[str, int]]


@dataclass
class QueueLoad:
    """QueueLoad: a queue's jobs not deleted, by stage, and what their pods hold."""

    stages: dict[str, int] = field(default_factory=dict)
    held: Res = field(default_factory=Res)


class ClusterView:
    """ClusterView answers queries over the controller's jobs, pods, nodes and queues.

    `jobs` maps every job in memory by id (deleted ones too, until they are reaped), `order`
    holds their keys in listing order, `names` maps a name to its jobs not deleted, oldest
    first, and `placed_on` maps a node to the jobs that have (or had) a pod placed there.
    """

    def __init__(
        self,
        *,
        jobs: Mapping[str, JobRecord],
        order: JobOrder,
        names: Mapping[str, Sequence[str]],
        nodes: Mapping[str, NodeRecord],
        queues: Mapping[str, QueueRecord],
        placed_on: Mapping[str, Collection[str]],
        experiments: Mapping[str, ExperimentRecord] | None = None,
        experiment_names: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self._experiments = experiments if experiments is not None else {}
        self._experiment_names = experiment_names if experiment_names is not None else {}
        self._jobs = jobs
        self._order = order
        self._names = names
        self._nodes = nodes
        self._queues = queues
        self._placed_on = placed_on

    # Jobs.

    def job(self, job_id: str) -> JobRecord | None:
        """job: the job with this id, deleted or not, while it is in memory."""
        return self._jobs.get(job_id)

    def find(self, name_or_id: str) -> JobRecord | None:
        """find returns the job (not deleted) a name or an id means. A name means the newest
        job of that name: a name is refused while a job of it is unfinished, so an unfinished
        job is always the newest of its name. An older run is reached by its id."""
        ids = self._names.get(name_or_id)
        job = self._jobs.get(ids[-1] if ids else name_or_id)
        return job if job is not None and not job.deleted else None

    def is_kept(self, job_id: str) -> bool:
        """is_kept: whether the job is in memory and not deleted."""
        job = self._jobs.get(job_id)
        return job is not None and not job.deleted

    def is_unfinished(self, job_id: str) -> bool:
        """is_unfinished: whether the job is kept and has not finished."""
        job = self._jobs.get(job_id)
        return job is not None and not job.deleted and not job.stage.finished

    def unfinished(self, name: str) -> JobRecord | None:
        """unfinished: the job of this name that has not finished, if any (at most one)."""
        job = self.find(name)
        return job if job is not None and job.name == name and not job.stage.finished else None

    def jobs(self) -> Collection[JobRecord]:
        """jobs: every job in memory, deleted ones too, in no particular order. It is the
        controller's own collection: iterate it only while the controller does not change."""
        return self._jobs.values()

    def listed(self, after: Key | None = None, owner: str | None = None) -> Iterator[JobRecord]:
        """listed yields the jobs not deleted in listing order (submit time, then id), from
        after the key `after` (None: from the oldest), of `owner` only when given. A page costs
        what it reads, not every job; the controller must not change while it is iterated."""
        for job_id in self._order.after(after, owner):
            job = self._jobs.get(job_id)
            if job is not None and not job.deleted:
                yield job

    def jobs_in_queue(self, queue: str) -> Iterator[JobRecord]:
        """jobs_in_queue yields the jobs not deleted of the queue. It walks every job."""
        for job in self._jobs.values():
            if job.spec.queue == queue and not job.deleted:
                yield job

    def queue_in_use(self, queue: str) -> int:
        """queue_in_use counts the unfinished jobs of a queue. It walks every job."""
        return sum(1 for job in self.jobs_in_queue(queue) if not job.stage.finished)

    # Experiments.

    def experiment(self, name_or_id: str) -> ExperimentRecord | None:
        """experiment: the experiment (not deleted) a name or an id means: a name means the
        newest of that name."""
        ids = self._experiment_names.get(name_or_id)
        if ids:
            return self._experiments.get(ids[-1])
        found = self._experiments.get(name_or_id)
        names = self._experiment_names.get(found.name, ()) if found is not None else ()
        return found if found is not None and found.id in names else None

    def named(self, name_or_id: str) -> JobRecord | ExperimentRecord | None:
        """named: the job or experiment (neither deleted) a name or an id means. Jobs and
        experiments share names: a name means the newest of those it names."""
        job, exp = self.find(name_or_id), self.experiment(name_or_id)
        if job is None or exp is None:
            return job or exp
        if name_or_id in (job.id, exp.id):
            return job if job.id == name_or_id else exp
        return exp if exp.submit_time > job.submit_time else job

    def running_experiment(self, name: str) -> ExperimentRecord | None:
        """running_experiment: the experiment of this name with a member not finished."""
        exp = self.experiment(name)
        if exp is None or exp.name != name:
            return None
        return exp if any(not j.stage.finished for j in self.members(exp)) else None

    def experiment_by_id(self, exp_id: str) -> ExperimentRecord | None:
        """experiment_by_id: the experiment with this id, deleted or not, while in memory."""
        return self._experiments.get(exp_id)

    def experiments(self) -> Collection[ExperimentRecord]:
        """experiments: every experiment in memory, deleted ones too, in no particular
        order (the controller's own collection)."""
        return self._experiments.values()

    def members(self, exp: ExperimentRecord) -> list[JobRecord]:
        """members: the experiment's members in memory, by index."""
        return [job for job_id in exp.members if (job := self._jobs.get(job_id)) is not None]

    # Pods.

    def pod(self, uid: str) -> tuple[JobRecord, PodRecord] | None:
        """pod: the pod with this uid ("<job id>/<pod name>") and its job, if in memory."""
        job_id, _, name = uid.partition("/")
        job = self._jobs.get(job_id)
        pod = job.pods.get(name) if job is not None else None
        return (job, pod) if job is not None and pod is not None else None

    def jobs_on(self, node: str) -> list[JobRecord]:
        """jobs_on: the jobs that have (or had) a pod placed on the node, in listing order."""
        ids = self._placed_on.get(node, ())
        return sorted((job for i in ids if (job := self._jobs.get(i)) is not None), key=key_of)

    def pods_on(self, node: str) -> list[tuple[JobRecord, PodRecord]]:
        """pods_on: the pods that hold resources on the node now, each with its job; jobs in
        listing order, each job's pods in declared order (leader first)."""
        return [
            (job, pod)
            for job in self.jobs_on(node)
            for pod in job.pods.values()
            if pod.node == node and pod.state.holds_resources
        ]

    def queue_loads(self) -> dict[str, QueueLoad]:
        """queue_loads: every queue's load (queues without jobs too). It walks every job."""
        loads = {queue: QueueLoad() for queue in self._queues}
        for job in self._jobs.values():
            if job.deleted:
                continue
            load = loads.setdefault(job.spec.queue, QueueLoad())
            load.stages[job.stage.value] = load.stages.get(job.stage.value, 0) + 1
            for pod in job.pods.values():
                if pod.state.holds_resources:
                    res = job.spec.template_of(pod.worker_set).resources
                    load.held = load.held + Res(res.cpu_milli, res.memory_bytes, res.gpu_milli)
        return loads

    # Nodes.

    def held_on(self, node: str) -> HeldOn:
        """held_on: what the pods holding resources on the node hold (see pods_on)."""
        held, pods = Res(), 0
        gpus: dict[int, dict[str, int]] = {}
        for job, pod in self.pods_on(node):
            res = job.spec.template_of(pod.worker_set).resources
            held = held + Res(res.cpu_milli, res.memory_bytes, res.gpu_milli)
            pods += 1
            for share in pod.gpus:
                by_job = gpus.setdefault(share.index, {})
                by_job[job.name] = by_job.get(job.name, 0) + share.milli
        return HeldOn(held, pods, gpus)

    def node(self, name: str) -> NodeRecord | None:
        return self._nodes.get(name)

    def address(self, node: str) -> str:
        """address: how the node's pods are reached ("" for a node not known)."""
        found = self._nodes.get(node)
        return found.address if found is not None else ""

    def nodes(self) -> list[NodeRecord]:
        """nodes: every node the server knows, Ready or not, sorted by name."""
        return sorted(self._nodes.values(), key=lambda node: node.name)

    def node_count(self) -> int:
        return len(self._nodes)

    # Queues.

    def queue(self, name: str) -> QueueRecord | None:
        return self._queues.get(name)

    def queues(self) -> list[QueueRecord]:
        """queues: every queue, the default one included, sorted by name."""
        return sorted(self._queues.values(), key=lambda queue: queue.name)
