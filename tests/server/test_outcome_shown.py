"""A finished job's outcome beyond `arranger history`: counted once per job in
`arranger_jobs_ended_total` (from 0 again when the server restarts), and shown on the dashboard's
jobs list and job page. Real server over loopback, asked over real HTTP."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from arranger.client.sdk import AsyncClient
from arranger.sched import Res
from arranger.server.controller import Controller, ControllerConfig
from arranger.server.metrics import ServerFacts, ServerMetrics
from arranger.states import PodState
from tests.conftest import bare_server, job_spec
from tests.server.test_history_outcome import report, running
from tests.server.test_request_metrics import value

OUTCOMES = ("Completed", "Failed", "Stopped", "Deleted")


def ended(exposition: str) -> dict[str, float | None]:
    return {o: value(exposition, f'arranger_jobs_ended_total{{outcome="{o}"}}') for o in OUTCOMES}


async def test_ended_jobs_are_counted_by_outcome_and_shown_on_the_dashboard(
    tmp_path: Path,
) -> None:
    data = tmp_path / "server"
    async with bare_server(data) as server, aiohttp.ClientSession() as http:
        async with AsyncClient(f"127.0.0.1:{server.port}", timeout_s=10) as client:
            for name in ("done", "gone", "stopped-then-deleted", "waits"):
                await client.submit(job_spec(name, ["true"]))
            await client.stop("done")  # a bare server runs nothing: it ends at once
            await client.delete("gone")  # deleted before it finished
            await client.stop("stopped-then-deleted")
            await client.delete("stopped-then-deleted")  # its record was written: not again
        web = server.web.url
        async with http.get(f"{web}/metrics") as reply:
            assert ended(await reply.text()) == {
                "Completed": 0.0,
                "Failed": 0.0,
                "Stopped": 2.0,
                "Deleted": 1.0,
            }
        async with http.get(f"{web}/jobs") as reply:
            listed = await reply.text()
        view = server.controller.view
        done, waits = view.find("done"), view.find("waits")
        assert done is not None and waits is not None
        assert f'<a href="/jobs/{done.id}">done</a>' in listed
        rows = {row.split("</a>")[0].rsplit(">")[-1]: row for row in listed.split("<tr")[2:]}
        assert '<td class="outcome">Stopped</td>' in rows["done"]
        assert '<td class="outcome">-</td>' in rows["waits"]  # not ended: no outcome
        assert "gone" not in rows and "stopped-then-deleted" not in rows
        async with http.get(f"{web}/jobs/{done.id}") as reply:
            assert '<span id="job-outcome">Stopped</span>' in await reply.text()
        async with http.get(f"{web}/jobs/{waits.id}") as reply:
            assert "job-outcome" not in await reply.text()
    async with bare_server(data) as again:  # the same store: its ended jobs are not recounted
        assert ended(again.metrics.exposition().decode()) == dict.fromkeys(OUTCOMES, 0.0)


def metrics() -> ServerMetrics:
    return ServerMetrics(
        ServerFacts(
            view=lambda: Controller(ControllerConfig()).view,
            deserved=lambda: {"default": Res()},
            active=lambda: True,
            agents=lambda: 0,
            store_writable=lambda: True,
            store_failures=lambda: 0,
            lease_remaining_s=lambda: None,
        )
    )


def test_a_record_written_again_as_pods_end_is_not_counted_again() -> None:
    m = metrics()
    deleted = Controller(ControllerConfig())
    job = running(deleted)
    m.stored(deleted.delete(job, 200.0), deleted.view)  # Deleted, its pods still stopping
    learner, a0, a1 = job.pods
    first = report(deleted, job, a0, PodState.KILLED, 210.0, code=143)
    assert first.rerecord == {job.id} and not first.ended  # the record again, with a0's exit
    m.stored(first, deleted.view)
    completed = Controller(ControllerConfig())
    job = running(completed)
    fx = report(completed, job, learner, PodState.SUCCEEDED, 300.0, code=0)
    assert fx.ended == {job.id}
    fx.merge(report(completed, job, a1, PodState.KILLED, 310.0, code=143))  # one batch
    assert len(fx.history) == 1 and fx.rerecord == {job.id}  # written once, as it is then
    m.stored(fx, completed.view)
    m.stored(report(completed, job, a0, PodState.KILLED, 320.0, code=143), completed.view)
    assert ended(m.exposition().decode()) == {
        "Completed": 1.0,
        "Failed": 0.0,
        "Stopped": 0.0,
        "Deleted": 1.0,
    }
