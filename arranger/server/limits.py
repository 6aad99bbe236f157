"""limits keep one user from hurting the rest: how much each may hold and how fast they may ask.

Per user: unfinished jobs and their pods, submits per second (a token bucket: a steady rate and
a burst; admins are not rate limited), open streams (counted by security.OpenStreams), and the
bytes of packages kept in the store (counted by package_quota, admins too). Per
job: the size of its whole spec as sent. A request over a limit is refused with
RESOURCE_EXHAUSTED and a message that names the limit by its configuration key. Per pod: the
most its pids limit may ask (`pidsPerPod`); a spec asking more is refused like any other invalid
spec, with INVALID_ARGUMENT naming the field and the setting (`above_maxima`).

The store's bytes, per user: what the jobs a user keeps take (`jobBytesPerUser`: each spec as
stored and STORED_POD_BYTES a pod), from their submit until they are deleted or pruned, finished
ones too (a job that ends at once is kept for jobRetentionDays all the same); per job, the
events stored (`eventsPerJob`, `EventBudget`). Reads of the store: pages of events and history
per second (`listsPerSecond`, `listBurst`: a token bucket, `ListGate`; admins are not rate
limited).

The counts follow change: each user's unfinished jobs are remembered by id when submitted and
dropped when a stored change finishes or deletes them (`settle`), so a check costs the same
whatever the user holds and whatever the cluster ever ran.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from arranger.identity import Principal
from arranger.server.model import EventRecord, JobRecord
from arranger.spec import JobSpec


@dataclass(frozen=True)
class UserLimits:
    """UserLimits: the server config's `limits` (README, "Security")."""

    jobs_per_user: int = 1_000  # unfinished jobs
    pods_per_user: int = 10_000  # pods of unfinished jobs
    submits_per_s: float = 20.0
    submit_burst: int = 100
    spec_bytes: int = 2**20  # one job's whole spec, as sent
    streams_per_user: int = 64  # open watch and log streams
    package_bytes: int = 100 * 2**20  # one working-directory package, packed
    stored_package_bytes_per_user: int = 4 * 2**30  # the packages a user owns, added up
    pids_per_pod: int = 65_536  # the most a pod's resources.pids may ask
    job_bytes_per_user: int = 64 * 2**20  # the jobs a user keeps, finished ones too, as stored
    events_per_job: int = 1_000  # events stored of one job (its end is stored past it)
    lists_per_s: float = 20.0  # pages of ListEvents and ListHistory
    list_burst: int = 100
    members_per_experiment: int = 1_000  # jobs one sweep may make

    @classmethod
    def from_mapping(cls, raw: object) -> UserLimits:
        if not isinstance(raw, dict):
            raise ValueError("limits: must be a mapping")
        keys = {
            "jobsPerUser": "jobs_per_user",
            "podsPerUser": "pods_per_user",
            "submitsPerSecond": "submits_per_s",
            "submitBurst": "submit_burst",
            "specBytes": "spec_bytes",
            "streamsPerUser": "streams_per_user",
            "packageBytes": "package_bytes",
            "pidsPerPod": "pids_per_pod",
            "storedPackageBytesPerUser": "stored_package_bytes_per_user",
            "jobBytesPerUser": "job_bytes_per_user",
            "eventsPerJob": "events_per_job",
            "listsPerSecond": "lists_per_s",
            "listBurst": "list_burst",
            "membersPerExperiment": "members_per_experiment",
        }
        unknown = set(raw) - set(keys)
        if unknown:
            raise ValueError(f"limits: unknown settings: {', '.join(sorted(map(str, unknown)))}")
        values: dict[str, float | int] = {}
        for key, name in keys.items():
            if key in raw:
                rate = name in ("submits_per_s", "lists_per_s")
                value = float(raw[key]) if rate else int(raw[key])
                if value <= 0:
                    raise ValueError(f"limits.{key}: must be above 0")
                values[name] = value
        return cls(**values)  # type: ignore[arg-type]

    def above_maxima(self, spec: JobSpec) -> list[str]:
        """above_maxima: the pod templates whose pids limit asks more than `pids_per_pod`,
        each naming its field path as written in YAML and the setting."""
        templates = [("spec.leader.template", spec.leader)]
        templates += [
            (f"spec.workerSets[{i}].template", ws.template) for i, ws in enumerate(spec.worker_sets)
        ]
        return [
            f"{path}.resources.pids: {template.resources.pids} is above this server's maximum "
            f"of {self.pids_per_pod} (limits.pidsPerPod)"
            for path, template in templates
            if template.resources.pids > self.pids_per_pod
        ]


# A pod's row in the store, with its index entries, about (a stored job's pods are counted in
# jobBytesPerUser at this size: a job of many pods that ends at once keeps them all).
STORED_POD_BYTES = 512


def stored_bytes(job: JobRecord) -> int:
    """stored_bytes: what the job takes in the store, as jobBytesPerUser counts it."""
    return len(job.spec_json) + len(job.pods) * STORED_POD_BYTES


@dataclass
class _Bucket:
    tokens: float
    at: float


def _take(buckets: dict[str, _Bucket], user: str, now_s: float, rate: float, burst: int) -> bool:
    """_take: whether the user's bucket holds a token now, taking it (`rate` tokens a second,
    at most `burst`; a new user's bucket is full)."""
    bucket = buckets.get(user)
    if bucket is None:
        bucket = buckets[user] = _Bucket(float(burst), now_s)
    elapsed = max(0.0, now_s - bucket.at)
    bucket.tokens = min(float(burst), bucket.tokens + elapsed * rate)
    bucket.at = now_s
    if bucket.tokens < 1.0:
        return False
    bucket.tokens -= 1.0
    return True


@dataclass
class SubmitGate:
    """SubmitGate answers whether a user may submit one more job now, and learns what each
    user holds. `live(job_id)` says whether a job is still unfinished and not deleted, `kept`
    whether the store still keeps it (not deleted or pruned; None: while it is live); the
    jobs a stored change touched are handed to `settle`, which drops those no longer live
    from the user's unfinished jobs and pods, and those no longer kept from their bytes."""

    limits: UserLimits
    live: Callable[[str], bool]
    kept: Callable[[str], bool] | None = None
    _held: dict[str, dict[str, int]] = field(default_factory=dict)  # user -> job id -> pods
    _pods: dict[str, int] = field(default_factory=dict)  # user -> pods of its held jobs
    _owner: dict[str, str] = field(default_factory=dict)  # held job id -> its user
    _bytes: dict[str, int] = field(default_factory=dict)  # user -> stored bytes of kept jobs
    _sizes: dict[str, tuple[str, int]] = field(default_factory=dict)  # kept job -> user, bytes
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    def restore(self, jobs: Iterable[JobRecord]) -> None:
        for job in jobs:
            if self.live(job.id):
                self.submitted(job)
            elif self._kept(job.id):
                self._keep(job)

    def problem(
        self, caller: Principal, pods: int, now_s: float, spec_bytes: int = 0, jobs: int = 1
    ) -> str:
        """problem: which per-user limit a submit of `jobs` jobs (an experiment's members)
        with `pods` pods and specs of `spec_bytes` in all would break ("" if none); a submit
        that is allowed takes one token from the caller's bucket. (The spec's own size is
        checked before it is parsed, by the API.)"""
        limits = self.limits
        held = len(self._held.get(caller.user, ()))
        if held + jobs > limits.jobs_per_user:
            more = f"; {jobs} more would pass it" if jobs > 1 else ""
            return (
                f"limits.jobsPerUser: user {caller.user!r} has {held} unfinished jobs "
                f"(limit {limits.jobs_per_user}){more}; wait for some to finish or delete them"
            )
        total = self._pods.get(caller.user, 0)
        if total + pods > limits.pods_per_user:
            return (
                f"limits.podsPerUser: user {caller.user!r} has {total} pods in unfinished jobs; "
                f"{pods} more would pass the limit of {limits.pods_per_user}"
            )
        kept, adding = self._bytes.get(caller.user, 0), spec_bytes + pods * STORED_POD_BYTES
        if kept + adding > limits.job_bytes_per_user:
            return (
                f"limits.jobBytesPerUser: user {caller.user!r} keeps {kept} bytes of jobs in "
                f"the store (finished ones too, until deleted or pruned); this job's {adding} "
                f"more would pass the limit of {limits.job_bytes_per_user}; delete finished "
                "jobs to make room"
            )
        if not caller.admin and not self._take(caller.user, now_s):
            return (
                f"limits.submitsPerSecond: user {caller.user!r} submits faster than "
                f"{limits.submits_per_s:g} per second (bursts of {limits.submit_burst}); "
                "retry shortly"
            )
        return ""

    def submitted(self, job: JobRecord) -> None:
        """submitted: the job is stored and counts for its owner until it is settled."""
        self._keep(job)
        if job.id in self._owner:
            return
        self._held.setdefault(job.owner, {})[job.id] = len(job.pods)
        self._pods[job.owner] = self._pods.get(job.owner, 0) + len(job.pods)
        self._owner[job.id] = job.owner

    def settle(self, job_ids: Iterable[str]) -> None:
        """settle: these jobs changed (and the change is stored); those no longer live stop
        counting for their owners."""
        for job_id in job_ids:
            self._release(job_id)
            user = self._owner.get(job_id)
            if user is None or self.live(job_id):
                continue
            del self._owner[job_id]
            held = self._held[user]
            left = self._pods[user] - held.pop(job_id)
            if held:
                self._pods[user] = left
            else:
                del self._held[user], self._pods[user]

    def bytes_problem(self, user: str, adding: int) -> str:
        """bytes_problem: why `adding` more bytes kept for the user would break
        limits.jobBytesPerUser ("" if they would not)."""
        kept, limit = self._bytes.get(user, 0), self.limits.job_bytes_per_user
        if adding <= 0 or kept + adding <= limit:
            return ""
        return (
            f"limits.jobBytesPerUser: user {user!r} keeps {kept} bytes of jobs and their "
            f"reported values in the store; {adding} more would pass the limit of {limit}; "
            "delete finished jobs to make room"
        )

    def grow(self, job_id: str, delta: int) -> None:
        """grow: a kept job takes `delta` more bytes in the store (its reported values)."""
        if job_id not in self._sizes:
            return
        user, size = self._sizes[job_id]
        self._sizes[job_id] = (user, size + delta)
        self._bytes[user] = self._bytes.get(user, 0) + delta

    def _kept(self, job_id: str) -> bool:
        return (self.kept or self.live)(job_id)

    def _keep(self, job: JobRecord) -> None:
        if job.id in self._sizes:
            return
        size = stored_bytes(job)
        self._sizes[job.id] = (job.owner, size)
        self._bytes[job.owner] = self._bytes.get(job.owner, 0) + size

    def _release(self, job_id: str) -> None:
        if job_id not in self._sizes or self._kept(job_id):
            return
        user, size = self._sizes.pop(job_id)
        left = self._bytes[user] - size
        if left > 0:
            self._bytes[user] = left
        else:
            del self._bytes[user]

    def _take(self, user: str, now_s: float) -> bool:
        limits = self.limits
        return _take(self._buckets, user, now_s, limits.submits_per_s, limits.submit_burst)


@dataclass
class ListGate:
    """ListGate answers whether a user may read one more page of events or history now: a
    token bucket per user (`listsPerSecond`, `listBurst`); admins are not rate limited."""

    limits: UserLimits
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    def problem(self, caller: Principal, now_s: float) -> str:
        limits = self.limits
        if caller.admin or _take(
            self._buckets, caller.user, now_s, limits.lists_per_s, limits.list_burst
        ):
            return ""
        return (
            f"limits.listsPerSecond: user {caller.user!r} reads pages of events and history "
            f"faster than {limits.lists_per_s:g} per second (bursts of {limits.list_burst}); "
            "retry shortly"
        )


# Events that come once a job (or once a change of a job that the server acts on): always
# stored, so that a job's submit, end and deletion are never lost to eventsPerJob; and each
# command run in a pod (Exec), the trail of who ran what, which no padding may hide.
ALWAYS_STORED = frozenset({"Submitted", "Succeeded", "Failed", "Deleted", "Pruned", "Exec"})
EVENTS_CAPPED = "EventsCapped"


@dataclass
class EventBudget:
    """EventBudget keeps each job's stored events within `limits.events_per_job`: past it, the
    job's events are not stored (one EVENTS_CAPPED event says so), but for ALWAYS_STORED.
    Events of no job (nodes, queues) are not counted. Counts are of this server's run (they
    start at 0 when it starts) and of events handed to be stored, written or not."""

    limits: UserLimits
    _stored: dict[str, int] = field(default_factory=dict)  # job id -> events counted

    def admit(self, events: list[EventRecord]) -> list[EventRecord]:
        """admit: the events to store of `events`, in their order."""
        cap = self.limits.events_per_job
        admitted = []
        for event in events:
            if not event.job_id or event.kind in ALWAYS_STORED:
                admitted.append(event)
                continue
            count = self._stored.get(event.job_id, 0)
            if count < cap:
                admitted.append(event)
            elif count == cap:
                message = (
                    f"more than {cap} events: later ones are not stored, but for its end "
                    "(limits.eventsPerJob)"
                )
                admitted.append(
                    EventRecord(event.time, EVENTS_CAPPED, message, event.job_id, event.job_name)
                )
            else:
                continue
            self._stored[event.job_id] = count + 1
        return admitted

    def forget(self, job_ids: Iterable[str]) -> None:
        """forget: these jobs are gone from the store; their counts go too."""
        for job_id in job_ids:
            self._stored.pop(job_id, None)
