"""Unhealthy GPUs through a real server, its API, dashboard and CLI, with an agent the test
plays (tests/played_agent.py) that says which of its GPUs are unhealthy in its Register and
heartbeats: nothing new is placed on them, the pods on them run on, an event names each once,
ListNodes, `arranger nodes` and the dashboard's GPU map show them, explain says why a job
waits, and a GPU heals when its agent registers again without it."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import aiohttp
import pytest

from arranger.client.sdk import AsyncClient
from arranger.sched import SchedulerConfig
from arranger.server.app import ArrangerServer
from arranger.v1 import agent_pb2, node_pb2
from tests.client.test_cli import arranger
from tests.conftest import FAST, bare_server, eventually, job_spec
from tests.played_agent import AnsweringAgent, played_agent, registration

# Jobs wait as long as the test needs; the played node is not declared lost meanwhile.
PATIENT = dataclasses.replace(
    FAST,
    scheduler=SchedulerConfig(infeasible_timeout_s=3600.0),
    controller=dataclasses.replace(FAST.controller, node_timeout_s=120.0),
)
ECC = "XID 48: double-bit ECC error"
FELL_OFF = "XID 79: GPU has fallen off the bus"
GPUS = [node_pb2.Gpu(index=i, uuid=f"GPU-{i}", model="A100", memory=2**35) for i in range(3)]


def one_gpu(name: str) -> dict[str, object]:
    spec = job_spec(name, leader=["sleep", "1000"], workerSets=[])
    spec["spec"]["leader"]["template"]["resources"]["gpu"] = 1
    return spec


async def unhealthy_events(client: AsyncClient) -> list[str]:
    return [e.message for e in await client.events() if e.kind == "GpuUnhealthy"]


async def test_an_unhealthy_gpu_takes_no_new_pod_and_the_pods_on_it_run_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # the table's width when printed into a pipe
    async with (
        bare_server(tmp_path / "server", PATIENT) as server,
        AsyncClient(f"127.0.0.1:{server.port}", timeout_s=10) as client,
    ):
        address = f"127.0.0.1:{server.port}"
        sick_at_start = [agent_pb2.GpuProblem(index=0, reason=ECC)]
        register = registration("n1", gpus=GPUS, gpu_problems=sick_at_start)
        async with played_agent(address, register) as stream:
            node = AnsweringAgent(stream)
            await eventually(lambda: "n1" in server.links, what="n1 registered")
            # GPU 0 was unhealthy as the node registered: the pod goes to GPU 1.
            await client.submit(one_gpu("first"))
            await eventually(lambda: "first" in node.gpus, what="first launched")
            assert node.gpus["first"] == [1]
            assert await eventually(lambda: unhealthy_events(client)) == [
                f"node n1 GPU 0: {ECC}; nothing more is placed on it (pods running on it run on)"
            ]
            await client.wait("first", stages=["Running"], timeout_s=10)

            # GPU 1 turns unhealthy under the running pod: the pod runs on.
            await node.heartbeats({0: ECC, 1: FELL_OFF})
            await client.submit(one_gpu("second"))
            await eventually(lambda: "second" in node.gpus, what="second launched")
            assert node.gpus["second"] == [2]
            await node.heartbeats({0: ECC, 1: FELL_OFF}, count=3)  # said again: no news
            await client.submit(one_gpu("third"))  # stored after whatever they changed
            assert await unhealthy_events(client) == [  # once each
                f"node n1 GPU {i}: {why}; nothing more is placed on it (pods running on it run on)"
                for i, why in ((0, ECC), (1, FELL_OFF))
            ]
            for _ in range(3):  # cycles that see the unhealthy GPUs
                cycles = server.cycles
                server.trigger()
                await eventually(lambda: server.cycles > cycles, what="a cycle")  # noqa: B023
            assert "third" not in node.gpus and node.killed == []
            first = await client.get("first")
            assert first.status.stage == "Running" and first.status.leader.state == "Running"
            explained = await client.explain("third")
            rejected = {r.reason: r.nodes for fit in explained.fits for r in fit.rejected}
            assert rejected == {"GPUs unhealthy there": 1}, explained
            await shown(server, client, address)

            # An agent that registers again finds its GPUs healthy (it restarted): they heal.
            await node.stop()
        async with played_agent(address, registration("n1", gpus=GPUS)) as stream:
            node = AnsweringAgent(stream)
            await eventually(lambda: "third" in node.gpus, what="third launched")
            assert node.gpus["third"] == [0]
            healed = [e.message for e in await client.events() if e.kind == "GpuHealthy"]
            assert sorted(healed) == [
                f"node n1 GPU {i} takes pods again: its agent finds it healthy" for i in (0, 1)
            ]
            listed = (await client.nodes())[0]
            assert [g.problem for g in listed.gpus] == ["", "", ""]
            await node.stop()


async def shown(server: ArrangerServer, client: AsyncClient, address: str) -> None:
    """shown: ListNodes, `arranger nodes` (table and JSON) and the GPU map show GPUs 0 and 1
    unhealthy and why."""
    listed = (await client.nodes())[0]
    assert [(g.index, g.problem) for g in listed.gpus] == [(0, ECC), (1, FELL_OFF), (2, "")]
    rc, out, err = await arranger("nodes", server=address)
    assert rc == 0, err
    row = next(line for line in out.splitlines() if line.split()[:1] == ["n1"])
    assert "2/3 A100 (2 unhealthy) [0:0! 1:1! 2:1]" in row, out
    rc, out, err = await arranger("nodes", "-o", "json", server=address)
    assert rc == 0, err
    gpus = json.loads(out)[0]["gpus"]
    assert [g.get("problem", "") for g in gpus] == [ECC, FELL_OFF, ""]
    exposed = server.metrics.exposition().decode()
    for gpu in ("0", "1"):  # what the ArrangerGpuUnhealthy alert reads
        assert f'arranger_gpu_unhealthy{{gpu="{gpu}",node="n1"}} 1.0' in exposed, exposed
    assert 'gpu="2"' not in exposed.split("arranger_gpu_unhealthy", 1)[1].split("# HELP")[0]
    async with aiohttp.ClientSession() as http, http.get(f"{server.web.url}/") as page:
        html = await page.text()
    assert re.search(r'id="gpus-unhealthy">2<', html), html
    cells = re.findall(r'<div class="gpu (\w+)" title="GPU (\d)', html)
    assert cells == [("unhealthy", "0"), ("unhealthy", "1"), ("full", "2")], cells
    assert f"unhealthy, takes no pods: {FELL_OFF}" in html
