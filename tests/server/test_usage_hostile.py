"""Usage reports the agents' stream carries, as a broken or forged agent could send them, into
a real server with real agents on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

import pytest

from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from arranger.server.usage import samples_of
from arranger.v1 import agent_pb2, job_pb2
from tests.conftest import eventually, job_spec, script

pytestmark = pytest.mark.e2e  # a real server, agents and processes

SLEEPS = "import signal\nsignal.pause()  # runs until stopped\n"


async def test_memory_figures_too_big_for_int64_added_up_still_list(
    cluster: DevCluster, client: AsyncClient, tmp_path: Path
) -> None:
    sleeps = script(tmp_path, "sleeps.py", SLEEPS)
    await client.submit(job_spec("hungry", leader=sleeps, workers=3))
    server = cluster.server
    view = server.controller.view
    await eventually(lambda: view.find("hungry").stage.value == "Running", what="the job to run")
    job = view.find("hungry")
    huge = 2**63 - 1
    by_node: dict[str, list[agent_pb2.PodUsage]] = {}
    for pod in job.pods.values():
        usage = job_pb2.Usage(memory_bytes=huge, memory_peak_bytes=huge)
        usage.gpus.add(index=0, utilization=50, memory_bytes=huge)
        usage.gpus.add(index=1, utilization=50, memory_bytes=huge)
        by_node.setdefault(pod.node, []).append(
            agent_pb2.PodUsage(pod_uid=pod.uid, attempt=pod.attempt, usage=usage)
        )
    for node, pods in by_node.items():
        report = agent_pb2.UsageReport(pods=pods)
        assert server.usage.report(node, samples_of(report, server.clock()), view) == len(pods)
    jobs = await client.jobs()
    assert [j.name for j in jobs] == ["hungry"]
    assert 0 < jobs[0].usage.memory_bytes < 2**63
    found = await client.get("hungry")
    assert found.status.leader.usage.memory_bytes < 2**63


async def test_a_pod_that_has_ended_is_shown_using_nothing(
    cluster: DevCluster, client: AsyncClient, tmp_path: Path
) -> None:
    sleeps = script(tmp_path, "sleeps.py", SLEEPS)
    await client.submit(job_spec("partly", leader=sleeps, worker=["true"], workers=1))
    server = cluster.server
    view = server.controller.view

    def worker_ended() -> bool:
        job = view.find("partly")
        return job.stage.value == "Running" and any(
            not p.live and p.node for p in job.pods.values()
        )

    await eventually(worker_ended, what="the worker to end while the leader runs", timeout_s=8)
    job = view.find("partly")
    ended = next(p for p in job.pods.values() if not p.live)
    report = agent_pb2.UsageReport(
        pods=[
            agent_pb2.PodUsage(
                pod_uid=ended.uid,
                attempt=ended.attempt,
                usage=job_pb2.Usage(cpu_cores=3.0, memory_bytes=2**30),
            )
        ]
    )
    assert server.usage.report(ended.node, samples_of(report, server.clock()), view) == 0
    assert ended.uid not in server.usage.latest
