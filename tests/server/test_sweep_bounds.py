"""`{name}` substitution could multiply a member's spec past every bound checked of its
experiment: each `{p}` (3 characters) becomes a value of up to 256 characters in every
member. Admission holds a member with the longest values to the bounds, and charges it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import grpc
import pytest

from arranger.client.sdk import AsyncClient
from arranger.client.specfile import load_job_data
from arranger.server.limits import UserLimits, stored_bytes
from arranger.v1 import arranger_pb2
from tests.conftest import bare_server, job_spec
from tests.server.test_experiments import WAITS


async def test_a_members_spec_stays_within_the_bounds_its_experiment_was_checked_to(
    tmp_path: Path,
) -> None:
    limits = UserLimits(job_bytes_per_user=4 * 2**20)  # 4 MiB kept per user
    config = dataclasses.replace(WAITS, limits=limits)
    arg = "{p}" * 30_000  # 90 KB: within argv_bytes (128 KiB) and specBytes (1 MiB)
    doc = job_spec("amp", ["python", arg])
    doc["spec"]["workerSets"] = []
    doc["spec"]["minWorkersNum"] = 0
    doc["spec"]["sweep"] = {"parameters": {"p": ["a" * 256, "b" * 256]}}
    async with (
        bare_server(tmp_path, config) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        request = arranger_pb2.SubmitJobRequest(job=load_job_data(doc), queue_anyway=True)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await client._stubs[0].SubmitJob(request)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (refused.value.details() or "").startswith(
            "spec.leader.template.args: with the sweep's longest values a member's command"
        )
        assert server.controller.view.experiment("amp") is None
        doc["spec"]["leader"]["template"]["command"] = ["python", "{p}" * 100]
        reply = await client._stubs[0].SubmitJob(
            arranger_pb2.SubmitJobRequest(job=load_job_data(doc), queue_anyway=True)
        )
        view = server.controller.view
        members = view.members(view.experiment(reply.experiment.id))
        kept = sum(stored_bytes(j) for j in members)
        assert kept <= limits.job_bytes_per_user
        assert max(len(j.spec.leader.command[1]) for j in members) == 25_600
