"""The per-user submit gate keeps its counts from changes; they equal a recount at any time."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from arranger.identity import Principal
from arranger.server.limits import SubmitGate, UserLimits
from arranger.server.model import JobRecord, PodRecord
from arranger.states import Role

USERS = ("alice", "bob", "carol")

# A step: submit a job of (user, pods), finish the i-th job submitted, or settle some jobs.
steps = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.sampled_from(USERS), st.integers(1, 5)),
        st.tuples(st.just("finish"), st.integers(0, 40), st.just(0)),
        st.tuples(st.just("settle"), st.integers(0, 40), st.integers(0, 40)),
    ),
    max_size=60,
)


def job(job_id: str, owner: str, pods: int) -> JobRecord:
    record = JobRecord(id=job_id, spec=None, spec_json="", submit_time=0, owner=owner)  # type: ignore[arg-type]
    for i in range(pods):
        record.pods[f"p{i}"] = PodRecord(
            f"{job_id}/p{i}", job_id, f"p{i}", Role.WORKER, "workers", i, i + 1, True
        )
    return record


@settings(max_examples=200, deadline=None)
@given(steps)
def test_counts_follow_settled_changes(plan: list[tuple[str, object, int]]) -> None:
    jobs: list[JobRecord] = []
    finished: set[str] = set()
    settled: set[str] = set()  # finished and told to the gate
    gate = SubmitGate(UserLimits(), lambda job_id: job_id not in finished)
    for kind, a, b in plan:
        if kind == "submit":
            record = job(f"j{len(jobs)}", str(a), b)
            jobs.append(record)
            gate.submitted(record)
            gate.submitted(record)  # told twice, counted once
        elif kind == "finish" and jobs:
            finished.add(jobs[int(str(a)) % len(jobs)].id)
        elif kind == "settle" and jobs:
            lo, hi = sorted((int(str(a)) % len(jobs), b % len(jobs)))
            ids = [j.id for j in jobs[lo : hi + 1]]
            gate.settle(ids)
            settled |= finished & set(ids)
    for user in USERS:
        counted = [j for j in jobs if j.owner == user and j.id not in settled]
        held_jobs, held_pods = len(counted), sum(len(j.pods) for j in counted)
        caller = Principal(user)
        gate.limits = UserLimits(jobs_per_user=held_jobs + 1, pods_per_user=10_000)
        assert gate.problem(caller, 0, 0.0) == ""
        gate.limits = UserLimits(jobs_per_user=held_jobs, pods_per_user=10_000)
        assert gate.problem(caller, 0, 0.0).startswith("limits.jobsPerUser")
        gate.limits = UserLimits(jobs_per_user=1_000, pods_per_user=held_pods + 2)
        assert gate.problem(caller, 2, 0.0) == ""
        assert gate.problem(caller, 3, 0.0).startswith("limits.podsPerUser")
