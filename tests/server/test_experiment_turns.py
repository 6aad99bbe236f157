"""Turns are handed on when a member goes without ever running: deleting a Pending member
(reaped in the same change) lets the next held member go, and deleting an experiment settles
the jobs that wait for it."""

from __future__ import annotations

from pathlib import Path

from arranger.client.sdk import AsyncClient
from arranger.client.specfile import load_job_data
from arranger.server.app import ArrangerServer
from arranger.server.experiments import TURN
from arranger.v1 import arranger_pb2
from tests.conftest import bare_server, job_spec
from tests.server.test_experiments import WAITS, submit, sweep


def held(server: ArrangerServer, name: str) -> list[str]:
    view = server.controller.view
    exp = view.experiment(name)
    assert exp is not None
    return [j.name for j in view.members(exp) if j.waiting and j.reason == TURN]


async def test_deleting_a_pending_member_hands_its_turn_on(tmp_path: Path) -> None:
    async with (
        bare_server(tmp_path, WAITS) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        await submit(client, sweep("one", {"lr": [1, 2, 3]}, maxParallel=1))
        assert held(server, "one") == ["one-1", "one-2"]
        await client._stubs[0].DeleteJob(arranger_pb2.DeleteJobRequest(name="one-0"))
        assert server.controller.view.find("one-0") is None  # reaped at once: nothing ran
        assert held(server, "one") == ["one-2"], (
            f"one-0's turn was never handed on: {held(server, 'one')} held, none in flight"
        )


async def test_deleting_an_experiment_settles_the_jobs_that_wait_for_it(tmp_path: Path) -> None:
    """The same for dependencies: members reaped in the change that ended them
    (DeleteExperiment of members never placed) settle the jobs that wait for the
    experiment."""
    async with (
        bare_server(tmp_path, WAITS) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        stub = client._stubs[0]
        await submit(client, sweep("e", {"lr": [1, 2]}))
        after = job_spec("after", ["true"])
        after["spec"]["dependsOn"] = [{"job": "e", "when": "succeeded"}]
        await stub.SubmitJob(
            arranger_pb2.SubmitJobRequest(job=load_job_data(after), queue_anyway=True)
        )
        job = server.controller.view.find("after")
        assert job.reason == "WaitingForDependencies"
        await stub.DeleteExperiment(arranger_pb2.DeleteExperimentRequest(name="e"))
        assert job.reason == "DependencyNeverMet", (
            f"every member of e deleted, yet after is {job.reason}: {job.message}"
        )
