"""A write whose transaction committed but whose answer was lost (the store's connection broke
at COMMIT): the server reads back what the store holds and keeps it. A submit so stored is
answered as done, and the job is in memory as in the store; nothing is stored twice."""

from __future__ import annotations

from pathlib import Path

from arranger.client.sdk import AsyncClient
from arranger.server.convert import spec_from_json
from arranger.server.store import Batch, StoreError
from tests.conftest import bare_server, job_spec


async def test_a_submit_whose_commit_answer_was_lost_is_kept(tmp_path: Path) -> None:
    async with bare_server(tmp_path / "server") as server:
        store = server.store
        committed = store._commit  # the real transaction, then a lost answer, once
        lost: list[bool] = []

        async def answer_lost(batch: Batch) -> None:
            await committed(batch)
            if not lost and batch.jobs:
                lost.append(True)
                raise StoreError("connection lost while committing")

        store._commit = answer_lost  # type: ignore[method-assign]
        async with AsyncClient(f"127.0.0.1:{server.port}", timeout_s=10) as client:
            job = await client.submit(job_spec("landed", ["true"]))
            assert lost  # the answer was lost, and the submit was answered all the same
            stored, _ = await store.load(spec_from_json)
            assert [j.id for j in stored] == [job.metadata.id]
            assert server.controller.view.job(job.metadata.id) is not None
            assert [j.name for j in await client.jobs()] == ["landed"]
