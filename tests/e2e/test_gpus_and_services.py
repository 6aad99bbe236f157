"""GPU placement with fake GPUs, and the standard gRPC services (health, reflection)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from arranger.agent.discovery import Capacity, GpuDevice
from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from tests.conftest import GI, eventually, job_spec, running_cluster, script

DUMP_ENV = """
import json, os, pathlib, signal
out = pathlib.Path(os.environ["ARRANGER_VOLUME_OUT"])
env = {k: v for k, v in os.environ.items() if k.startswith(("CUDA", "ARRANGER"))}
name = os.environ["ARRANGER_POD_NAME"]
(out / f".{name}").write_text(json.dumps(env))
(out / f".{name}").rename(out / name)  # readers never see a half-written file
signal.pause()  # runs until stopped
"""

FAKE = Capacity(
    4000, 8 * GI, tuple(GpuDevice(i, f"fake-{i}", "FakeGPU", 16 * GI, fake=True) for i in range(2))
)


@pytest.fixture
async def gpu_cluster(tmp_path: Path) -> AsyncIterator[DevCluster]:
    async with running_cluster(tmp_path / "cluster", FAKE) as c:
        yield c


async def test_gpu_pods_get_their_devices_and_nodes_show_them(
    gpu_cluster: DevCluster, tmp_path: Path
) -> None:
    out = tmp_path / "env"
    out.mkdir()
    dump = script(tmp_path, "dump", DUMP_ENV)
    spec = job_spec(
        "gpus",
        leader=dump,
        workers=2,
        volumes=[{"name": "out", "hostPath": str(out)}],
        minWorkersNum=2,
    )
    spec["spec"]["leader"]["template"]["resources"].update(gpu=2, gpuType="FakeGPU")
    spec["spec"]["workerSets"][0]["template"]["resources"]["gpu"] = 0.5
    async with AsyncClient(gpu_cluster.address) as client:
        await client.submit(spec)
        running = await client.wait("gpus", stages=["Running"], timeout_s=30)
        leader = running.status.leader
        assert [(g.index, g.share) for g in leader.gpus] == [(0, 1.0), (1, 1.0)]
        workers = running.status.workers
        # Both halves share one GPU of the other node (the leader took all of its node's).
        assert {w.node for w in workers} == {"dev-0", "dev-1"} - {leader.node}
        assert [(g.index, g.share) for w in workers for g in w.gpus] == [(0, 0.5), (0, 0.5)]
        nodes = {n.name: n for n in await client.nodes()}
        assert nodes[leader.node].allocated.gpu == 2 and all(
            g.fake for g in nodes[leader.node].gpus
        )
        assert [g.allocated for g in nodes[workers[0].node].gpus] == [1.0, 0.0]

        envs = {}
        for pod in [leader, *workers]:
            path = out / pod.name
            await eventually(path.exists, what=f"{pod.name} to write its environment")
            envs[pod.name] = json.loads(path.read_text())
        assert envs[leader.name]["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert all(envs[w.name]["CUDA_VISIBLE_DEVICES"] == "0" for w in workers)
        assert all(envs[w.name]["ARRANGER_GPU_FRACTION"] == "0.5" for w in workers)
        await client.delete("gpus")


async def test_health_and_reflection_are_served(gpu_cluster: DevCluster) -> None:
    async with grpc.aio.insecure_channel(gpu_cluster.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        responses = [r async for r in reflection.ServerReflectionInfo(iter([request]))]
        names = {s.name for s in responses[0].list_services_response.service}
        assert {
            "arranger.v1.Arranger",
            "arranger.v1.AgentService",
            "grpc.health.v1.Health",
        } <= names


async def test_four_fractional_actors_share_one_gpu_and_see_their_share(
    gpu_cluster: DevCluster, tmp_path: Path
) -> None:
    out = tmp_path / "env"
    out.mkdir()
    dump = script(tmp_path, "dump", DUMP_ENV)
    spec = job_spec(
        "shares",
        leader=dump,
        workers=4,
        minWorkersNum=4,
        volumes=[{"name": "out", "hostPath": str(out)}],
    )
    spec["spec"]["workerSets"][0]["template"]["resources"]["gpu"] = 0.25
    async with AsyncClient(gpu_cluster.address) as client:
        await client.submit(spec)
        workers = (await client.wait("shares", stages=["Running"], timeout_s=30)).status.workers
        assert len({w.node for w in workers}) == 1  # packed: one GPU of one node
        assert [(g.index, g.share) for w in workers for g in w.gpus] == [(0, 0.25)] * 4
        node = next(n for n in await client.nodes() if n.name == workers[0].node)
        assert [g.allocated for g in node.gpus] == [1.0, 0.0]
        for worker in workers:
            path = out / worker.name
            await eventually(path.exists, what=f"{worker.name} to write its environment")
            env = json.loads(path.read_text())
            assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["ARRANGER_GPU_FRACTION"] == "0.25"
            assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env  # the agent is not set up for MPS
        await client.delete("shares")
