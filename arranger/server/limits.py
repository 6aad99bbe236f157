"""limits keep one user from hurting the rest: how much each may hold and how fast they may ask.

Per user: unfinished jobs and their pods, submits per second (a token bucket: a steady rate and
a burst; admins are not rate limited), and open streams (counted by security.OpenStreams). Per
job: the size of its whole spec as sent. A request over a limit is refused with
RESOURCE_EXHAUSTED and a message that names the limit by its configuration key. Per pod: the
most its pids limit may ask (`pidsPerPod`); a spec asking more is refused like any other invalid
spec, with INVALID_ARGUMENT naming the field and the setting (`above_maxima`).

The counts follow change: each user's unfinished jobs are remembered by id when submitted and
dropped when a stored change finishes or deletes them (`settle`), so a check costs the same
whatever the user holds and whatever the cluster ever ran.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from arranger.identity import Principal
from arranger.server.model import JobRecord
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
    pids_per_pod: int = 65_536  # the most a pod's resources.pids may ask

    @classmethod
    def from_mapping(cls, raw: object) -> UserLimits:
        if not isinstance(raw, dict):
            raise ValueError("limits: must be a mapping")
        keys = {
            "jobsPerUser": "jobs_per_user", "podsPerUser": "pods_per_user",
            "submitsPerSecond": "submits_per_s", "submitBurst": "submit_burst",
            "specBytes": "spec_bytes", "streamsPerUser": "streams_per_user",
            "packageBytes": "package_bytes", "pidsPerPod": "pids_per_pod",
        }  # fmt: skip
        unknown = set(raw) - set(keys)
        if unknown:
            raise ValueError(f"limits: unknown settings: {', '.join(sorted(map(str, unknown)))}")
        values: dict[str, float | int] = {}
        for key, name in keys.items():
            if key in raw:
                value = float(raw[key]) if name == "submits_per_s" else int(raw[key])
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


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class SubmitGate:
    """SubmitGate answers whether a user may submit one more job now, and learns what each
    user holds. `live(job_id)` says whether a job is still unfinished and not deleted; the
    jobs a stored change touched are handed to `settle`, which drops those no longer live."""

    limits: UserLimits
    live: Callable[[str], bool]
    _held: dict[str, dict[str, int]] = field(default_factory=dict)  # user -> job id -> pods
    _pods: dict[str, int] = field(default_factory=dict)  # user -> pods of its held jobs
    _owner: dict[str, str] = field(default_factory=dict)  # held job id -> its user
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    def restore(self, jobs: Iterable[JobRecord]) -> None:
        for job in jobs:
            if self.live(job.id):
                self.submitted(job)

    def problem(self, caller: Principal, pods: int, now_s: float) -> str:
        """problem: which per-user limit a submit of a job with `pods` pods would break ("" if
        none); a submit that is allowed takes from the caller's bucket. (The spec's size is
        checked before the spec is parsed, by the API.)"""
        limits = self.limits
        jobs = len(self._held.get(caller.user, ()))
        if jobs + 1 > limits.jobs_per_user:
            return (
                f"limits.jobsPerUser: user {caller.user!r} has {jobs} unfinished jobs "
                f"(limit {limits.jobs_per_user}); wait for some to finish or delete them"
            )
        total = self._pods.get(caller.user, 0)
        if total + pods > limits.pods_per_user:
            return (
                f"limits.podsPerUser: user {caller.user!r} has {total} pods in unfinished jobs; "
                f"{pods} more would pass the limit of {limits.pods_per_user}"
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
        if job.id in self._owner:
            return
        self._held.setdefault(job.owner, {})[job.id] = len(job.pods)
        self._pods[job.owner] = self._pods.get(job.owner, 0) + len(job.pods)
        self._owner[job.id] = job.owner

    def settle(self, job_ids: Iterable[str]) -> None:
        """settle: these jobs changed (and the change is stored); those no longer live stop
        counting for their owners."""
        for job_id in job_ids:
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

    def _take(self, user: str, now_s: float) -> bool:
        limits = self.limits
        bucket = self._buckets.get(user)
        if bucket is None:
            bucket = self._buckets[user] = _Bucket(float(limits.submit_burst), now_s)
        elapsed = max(0.0, now_s - bucket.at)
        bucket.tokens = min(
            float(limits.submit_burst), bucket.tokens + elapsed * limits.submits_per_s
        )
        bucket.at = now_s
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True
