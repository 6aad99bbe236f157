"""GPU health end to end: a real server and a real agent whose NVML is a stand-in (no driver,
tests/agent/nvml_stand_in.py). XID 79 on the GPU a pod runs on, and a rising uncorrectable
ECC count on an idle one, make both unhealthy: the pod runs on, the next GPU job goes to the
one healthy GPU left and the one after waits, an event names each node and GPU once, and
`arranger nodes` and ListNodes show them. An application XID (13) changes nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from arranger.agent.discovery import Capacity, GpuDevice
from arranger.client.sdk import AsyncClient
from tests.agent.nvml_stand_in import NvmlStandIn
from tests.client.test_cli import arranger
from tests.conftest import GI, eventually, job_spec, running_cluster, script

FELL_OFF = "XID 79: GPU has fallen off the bus"
ECC = "uncorrectable ECC errors: 2 new"
GPUS = Capacity(4000, 8 * GI, tuple(GpuDevice(i, f"GPU-{i}", "A100", 16 * GI) for i in range(3)))


def one_gpu(name: str, command: list[str]) -> dict[str, object]:
    spec = job_spec(name, leader=command, workerSets=[])
    spec["spec"]["leader"]["template"]["resources"]["gpu"] = 1
    return spec


async def test_xid_and_ecc_errors_on_a_real_agent_keep_new_pods_off_those_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # the table's width when printed into a pipe
    nvml = NvmlStandIn(["GPU-0", "GPU-1", "GPU-2"], ecc={0: 0, 1: 7, 2: 0})
    monkeypatch.setitem(sys.modules, "pynvml", nvml)  # what the agent's `import pynvml` finds
    waits = script(tmp_path, "waits", "import signal\nsignal.pause()\n")
    async with (
        running_cluster(tmp_path / "cluster", GPUS, agents=1) as cluster,
        AsyncClient(cluster.address, timeout_s=10) as client,
    ):
        name = cluster.agents[0].config.node_name
        await client.submit(one_gpu("keeps", waits))
        keeps = await client.wait("keeps", stages=["Running"], timeout_s=30)
        assert [g.index for g in keeps.status.leader.gpus] == [0]
        await eventually(lambda: nvml.ecc_reads >= 3, what="the first ECC counts read")

        nvml.raise_xid(2, 13)  # an application error: GPU 2 stays healthy
        nvml.raise_xid(0, 79)  # under the running pod
        nvml.ecc[1] = 9  # idle, its count rises
        events = await eventually(
            lambda: _unhealthy(client), what="two GpuUnhealthy events", timeout_s=30
        )
        assert events == [
            f"node {name} GPU {i}: {why}; nothing more is placed on it (pods running on it run on)"
            for i, why in sorted(((0, FELL_OFF), (1, ECC)))
        ]
        await client.submit(one_gpu("moves", waits))
        moves = await client.wait("moves", stages=["Running"], timeout_s=30)
        assert [g.index for g in moves.status.leader.gpus] == [2]
        await client.submit(one_gpu("waits", waits))
        explained = await eventually(lambda: _waiting(client, "waits"), what="waits decided")
        assert "1 GPUs unhealthy there" in explained.status.message, explained.status
        keeps = await client.get("keeps")  # never stopped nor started again
        assert keeps.status.stage == "Running" and keeps.status.leader.attempt == 0

        listed = {n.name: n for n in await client.nodes()}[name]
        assert [g.problem for g in listed.gpus] == [FELL_OFF, ECC, ""]
        rc, out, err = await arranger("nodes", server=cluster.address)
        assert rc == 0, err
        assert "2/3 A100 (2 unhealthy) [0:1! 1:0! 2:1]" in out, out
        assert sorted(await _unhealthy(client)) == events  # said in every heartbeat, told once


async def _unhealthy(client: AsyncClient) -> list[str] | None:
    """_unhealthy: the GpuUnhealthy events, sorted, once there are two (None before)."""
    found = sorted(e.message for e in await client.events() if e.kind == "GpuUnhealthy")
    return found if len(found) >= 2 else None


async def _waiting(client: AsyncClient, name: str) -> object:
    job = await client.get(name)
    return job if job.status.reason != "Submitted" else None  # a cycle has decided
