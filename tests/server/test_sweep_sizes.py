"""A member is measured as it is bounded and charged: its command line in UTF-8 bytes, its
spec as stored (JSON, escapes included), so a value shorter in characters cannot make a
larger member than admission held to the bounds."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import grpc
import pytest

from arranger.client.sdk import AsyncClient
from arranger.client.specfile import load_job_data
from arranger.server.limits import UserLimits
from arranger.server.spec_bounds import BOUNDS
from arranger.v1 import arranger_pb2
from tests.conftest import bare_server, job_spec
from tests.server.test_experiments import WAITS


def _doc(name: str, arg: str, values: list[str]) -> dict:
    doc = job_spec(name, ["python", arg])
    doc["spec"]["workerSets"] = []
    doc["spec"]["minWorkersNum"] = 0
    doc["spec"]["sweep"] = {"parameters": {"p": values}}
    return doc


async def test_a_members_argv_stays_within_argv_bytes_with_multibyte_values(
    tmp_path: Path,
) -> None:
    # 'a' * 256: 200 x 256 = 51,200 bytes; '\U0001f600' * 255: 200 x 1,020 = 204,000 bytes.
    doc = _doc("utf", "{p}" * 200, ["a" * 256, "\U0001f600" * 255])
    async with (
        bare_server(tmp_path, WAITS) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        request = arranger_pb2.SubmitJobRequest(job=load_job_data(doc), queue_anyway=True)
        try:
            reply = await client._stubs[0].SubmitJob(request)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
            return
        view = server.controller.view
        members = view.members(view.experiment(reply.experiment.id))
        widest = max(
            sum(len(a.encode()) + 1 for a in (*j.spec.leader.command, *j.spec.leader.args))
            for j in members
        )
        assert widest <= BOUNDS.argv_bytes, (
            f"a member's argv takes {widest} bytes, above argv_bytes {BOUNDS.argv_bytes} "
            "(and above Linux's MAX_ARG_STRLEN: its pods cannot exec)"
        )


async def test_a_submit_never_takes_the_user_past_job_bytes_per_user(tmp_path: Path) -> None:
    # '\x01' is one character, six in JSON (\u0001): admission charges the 'a' member.
    limit = 400_000
    config = dataclasses.replace(WAITS, limits=UserLimits(job_bytes_per_user=limit))
    doc = _doc("esc", "{p}" * 300, ["a" * 256, "\x01" * 255])
    async with (
        bare_server(tmp_path, config) as server,
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        request = arranger_pb2.SubmitJobRequest(job=load_job_data(doc), queue_anyway=True)
        try:
            await client._stubs[0].SubmitJob(request)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() in (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                grpc.StatusCode.INVALID_ARGUMENT,
            )
            return
        kept = server.submits._bytes.get("root", 0)
        assert kept <= limit, f"one admitted submit leaves the user at {kept} bytes, limit {limit}"


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
