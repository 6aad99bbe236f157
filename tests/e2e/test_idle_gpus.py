"""Idle GPUs on a real cluster (a server and two agents with fake GPUs on 127.0.0.1, real
processes): readings injected as the agents' usage reports carry them mark a pod whose GPUs
stay idle, and `list`, `get`, `top`, the dashboard's GPU map and the events show it; a queue
set by the CLI to stop such jobs stops it, saying why."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from arranger.server.agent_service import IDLE_STOPPER, watch_idle
from arranger.server.dashboard_pages import cluster_page
from arranger.server.usage import samples_of
from arranger.v1 import agent_pb2, job_pb2
from tests.conftest import FAST, job_spec, running_cluster, script
from tests.e2e.test_elastic import arranger_cli
from tests.e2e.test_gpus_and_services import FAKE

SLEEPS = "import signal\nsignal.pause()  # runs until stopped\n"


def readings(job_id: str, pod: job_pb2.PodStatus, utilization: float) -> agent_pb2.UsageReport:
    """readings: a usage report of one pod's GPUs, as an agent sends it."""
    usage = job_pb2.Usage(cpu_cores=0.2, memory_bytes=2**28)
    for gpu in pod.gpus:
        usage.gpus.add(index=gpu.index, utilization=utilization, memory_bytes=2**30)
    return agent_pb2.UsageReport(
        pods=[agent_pb2.PodUsage(pod_uid=f"{job_id}/{pod.name}", attempt=pod.attempt, usage=usage)]
    )


async def test_an_idle_gpu_is_marked_everywhere_and_its_queue_stops_the_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = dataclasses.replace(FAST, idle_gpu_s=600.0)
    async with (
        running_cluster(tmp_path / "cluster", FAKE, config=config) as cluster,
        AsyncClient(cluster.address, timeout_s=10) as client,
    ):
        await run(cluster, client, tmp_path, capsys)


async def run(
    cluster: DevCluster, client: AsyncClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = await arranger_cli(
        capsys,
        "--server",
        cluster.address,
        "queue",
        "create",
        "labq",
        "--idle-gpu-stop-minutes",
        "5",
    )
    assert code == 0, err
    spec = job_spec("holder", leader=script(tmp_path, "sleeps", SLEEPS), workers=0)
    spec["metadata"]["queue"] = "labq"
    spec["spec"]["workerSets"] = []
    spec["spec"]["minWorkersNum"] = 0
    spec["spec"]["leader"]["template"]["resources"]["gpu"] = 1
    await client.submit(spec)
    running = await client.wait("holder", stages=["Running"], timeout_s=30)
    leader = running.status.leader
    server = cluster.server
    watch, view = server.idle, server.controller.view

    async def read(at: float, utilization: float) -> None:
        """read: the agent's usage report, taken in as the agents' stream takes it."""
        samples = samples_of(readings(running.metadata.id, leader, utilization), at)
        server.usage.report(leader.node, samples, view)
        await watch_idle(watch, server.controller, server.commit, leader.node, samples, at)

    t0 = server.clock()
    for minute in range(11):  # idle for idleGpuMinutes (10), a reading a minute
        await read(t0 + 60 * minute, 1.0)
    code, out, _ = await arranger_cli(capsys, "--server", cluster.address, "list")
    assert code == 0 and "; GPUs idle: holder-learner" in out
    code, out, _ = await arranger_cli(capsys, "--server", cluster.address, "top", "--once")
    assert code == 0 and "idle(1)" in out, out
    got = await client.get("holder")
    assert got.status.leader.HasField("gpu_idle_since")
    page = cluster_page(view)
    assert page.unused == 1
    (node,) = [n for n in page.nodes if any(g.unused for g in n.gpus)]
    assert node.name == leader.node
    assert [g.unused for g in node.gpus if g.unused] == [("holder",)]
    idle = [e for e in await client.events("holder") if e.kind == "GpuIdle"]
    assert len(idle) == 1 and "unused: under 5% for 10 min" in idle[0].message

    for minute in range(11, 16):  # 5 more minutes: queue labq stops it
        await read(t0 + 60 * minute, 0.0)
    done = await client.wait("holder", timeout_s=30)
    assert done.status.stage == "Succeeded" and done.status.reason == "Stopped"
    assert done.status.message == "stopped by request of arranger (idle GPUs)"
    why = [e.message for e in await client.events("holder") if e.kind == "IdleGpuStop"]
    assert len(why) == 1 and "queue 'labq' stops such jobs 5 min after" in why[0]
    (record,) = await client.history(name="holder")
    assert record.stopped_by == IDLE_STOPPER
