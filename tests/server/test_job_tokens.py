"""Job tokens: made and checked with the cluster's key, good for their own live job only."""

from __future__ import annotations

from arranger.server.job_tokens import JobTokens
from arranger.server.model import JobRecord

KEY = "00" * 32


def job(job_id: str) -> JobRecord:
    return JobRecord(id=job_id, spec=None, spec_json="", submit_time=0)  # type: ignore[arg-type]


def test_every_token_of_a_live_job_names_it_even_when_its_mac_holds_an_underscore() -> None:
    jobs = {i: job(i) for i in (f"{n:012x}" for n in range(40))}
    tokens = JobTokens(jobs.get)
    tokens.open(KEY, "127.0.0.1:1", None)
    with_underscore = [i for i in jobs if "_" in tokens.token(i)[len("arj_") + 12 + 1 :]]
    assert with_underscore, "some macs hold '_' (URL-safe base64)"
    for job_id in jobs:
        principal = tokens.identify(tokens.token(job_id))
        assert principal is not None and principal.job == job_id, job_id


def test_a_token_is_refused_once_its_job_ended_or_when_forged() -> None:
    record = job("0123456789ab")
    tokens = JobTokens({record.id: record}.get)
    tokens.open(KEY, "127.0.0.1:1", None)
    good = tokens.token(record.id)
    assert tokens.identify(good[:-1] + ("A" if good[-1] != "A" else "B")) is None
    assert tokens.identify(f"arj_ffffffffffff_{good.rpartition('_')[2]}") is None
    record.deleted = True
    assert tokens.identify(good) is None
