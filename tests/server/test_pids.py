"""A pod's pids limit (`resources.pids`): refused above the server's `limits.pidsPerPod`, kept
in the stored spec, and sent to the agent in the pod's LaunchPod.

A real server on 127.0.0.1:0 and a node whose agent the test plays: it registers, then reads
what the server orders.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import grpc
import pytest

from arranger.client.channel import ArrangerError
from arranger.client.sdk import AsyncClient
from arranger.server.limits import UserLimits
from tests.conftest import FAST, bare_server, eventually, job_spec
from tests.played_agent import launches, played_agent, registration, running


def with_pids(name: str, leader: int, workers: int) -> dict[str, Any]:
    """with_pids: a job of a leader and 2 workers whose templates ask these pids limits."""
    body = job_spec(name, ["true"], workers=2)
    body["spec"]["leader"]["template"]["resources"]["pids"] = leader
    body["spec"]["workerSets"][0]["template"]["resources"]["pids"] = workers
    return body


async def test_a_pods_pids_limit_reaches_its_launch_and_survives_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "server"
    async with bare_server(data) as server:
        address = f"127.0.0.1:{server.port}"
        async with (
            played_agent(address, registration("n1")) as stream,
            AsyncClient(address, timeout_s=10) as client,
        ):
            await eventually(lambda: "n1" in server.controller.nodes, what="registration")
            await client.submit(with_pids("pids", leader=8192, workers=0))
            (leader,) = await launches(stream, 1)  # workers wait for the leader's address
            await stream.write(running(leader))
            sent = {launch.pod_name: launch.pids for launch in [leader, *await launches(stream, 2)]}
    assert sent == {"pids-learner": 8192, "pids-actors-0": 0, "pids-actors-1": 0}
    async with (
        bare_server(data) as server,
        AsyncClient(f"127.0.0.1:{server.port}", timeout_s=10) as client,
    ):
        spec = (await client.get("pids")).spec
        assert spec.leader.template.resources.pids == 8192
        assert spec.worker_sets[0].template.resources.pids == 0


async def test_a_pids_limit_above_the_servers_maximum_is_refused_naming_field_and_setting(
    tmp_path: Path,
) -> None:
    config = dataclasses.replace(FAST, limits=UserLimits(pids_per_pod=4096))
    async with (
        bare_server(tmp_path / "server", config) as server,
        AsyncClient(f"127.0.0.1:{server.port}", timeout_s=10) as client,
    ):
        with pytest.raises(ArrangerError) as refused:
            await client.submit(with_pids("many", leader=100_000, workers=4097))
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.message == (
            "spec.leader.template.resources.pids: 100000 is above this server's maximum of 4096 "
            "(limits.pidsPerPod); spec.workerSets[0].template.resources.pids: 4097 is above "
            "this server's maximum of 4096 (limits.pidsPerPod)"
        )
        with pytest.raises(ArrangerError) as refused:
            await client.submit(with_pids("negative", leader=-1, workers=0))
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.message == (
            "spec.leader.template.resources.pids: must be a whole number >= 0 (0: the node's "
            "default)"
        )
        accepted = await client.submit(with_pids("many", leader=4096, workers=4096))
        assert accepted.spec.leader.template.resources.pids == 4096


def test_the_pids_maximum_is_a_limits_setting_above_zero() -> None:
    assert UserLimits().pids_per_pod == 65_536
    assert UserLimits.from_mapping({"pidsPerPod": 8192}).pids_per_pod == 8192
    for bad in (0, -1):
        with pytest.raises(ValueError, match=r"limits\.pidsPerPod: must be above 0"):
            UserLimits.from_mapping({"pidsPerPod": bad})
