"""What one user can make the store (and the server's memory) keep is bounded, within limits.

The jobs a user keeps, finished ones too until deleted or pruned, are bounded in bytes
(limits.jobBytesPerUser: a job that ends at once is kept all the same, so the unfinished
jobs' limits alone do not bound them); the events stored of one job are bounded in number
(limits.eventsPerJob), its end stored past the bound.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from arranger.server.limits import EVENTS_CAPPED, STORED_POD_BYTES, UserLimits
from tests.conftest import job_spec
from tests.server.test_tenancy import lab, refusal


def blob_job(name: str, blob_bytes: int) -> dict[str, object]:
    body = job_spec(name, ["true"])
    body["spec"]["leader"]["template"]["env"] = {"BLOB": "x" * blob_bytes}  # type: ignore[index]
    return body


async def test_the_jobs_a_user_keeps_are_bounded_in_bytes_finished_ones_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    limits = UserLimits(job_bytes_per_user=100_000, spec_bytes=64 * 1024)
    async with lab(tmp_path, capsys, limits=limits) as it:
        for i in range(3):  # each about 30 KB as stored
            await it.alice.submit(blob_job(f"a{i}", 30_000))
            await it.alice.stop(f"a{i}")  # finished at once (it was never placed)
        assert (await it.alice.get("a0")).status.stage in ("Succeeded", "Failed")
        refused = await refusal(it.alice.submit(blob_job("a3", 30_000)))
        assert refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED, refused
        assert refused.message.startswith("limits.jobBytesPerUser: user 'alice' keeps "), (
            refused.message
        )
        assert "(finished ones too, until deleted or pruned)" in refused.message
        assert f"more would pass the limit of {limits.job_bytes_per_user}" in refused.message
        await it.bob.submit(blob_job("b0", 30_000))  # bob's bytes are his own
        await it.alice.delete("a0")  # a deleted job gives its bytes back
        await it.alice.submit(blob_job("a3", 30_000))
        # Pods count too: a job of many pods that ends at once keeps them all.
        many = 100_000 // STORED_POD_BYTES
        refused = await refusal(it.bob.submit(job_spec("wide", ["true"], workers=many)))
        assert refused.message.startswith("limits.jobBytesPerUser: user 'bob'"), refused.message


async def test_a_job_s_stored_events_are_bounded_and_its_end_is_stored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    limits = UserLimits(events_per_job=6)
    async with lab(tmp_path, capsys, limits=limits) as it:
        body = job_spec("elastic", ["true"])
        body["spec"]["workerSets"][0]["maxCounts"] = 3  # type: ignore[index]
        await it.alice.submit(body)
        for i in range(20):
            await it.alice.scale("elastic", "actors", 2 + i % 2)
        await it.alice.stop("elastic")
        await it.alice.wait("elastic", timeout_s=30)
        kinds = [e.kind for e in await it.alice.events("elastic")]
        assert kinds[0] == "Submitted" and kinds[-1] in ("Succeeded", "Failed"), kinds
        counted = [k for k in kinds if k not in ("Submitted", "Succeeded", "Failed")]
        assert len(counted) == limits.events_per_job + 1, kinds
        assert counted[-1] == EVENTS_CAPPED and counted.count("Scaled") <= limits.events_per_job
        capped = [e for e in await it.alice.events("elastic") if e.kind == EVENTS_CAPPED]
        assert "limits.eventsPerJob" in capped[0].message
        # Another job's events are its own.
        body["metadata"]["name"] = "other"  # type: ignore[index]
        await it.alice.submit(body)
        await it.alice.scale("other", "actors", 2)
        assert "Scaled" in [e.kind for e in await it.alice.events("other")]
