"""The blocking SDK client against a real cluster (run in a thread: the cluster shares our loop)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from arranger.client.dev import DevCluster
from arranger.client.sdk import ArrangerError, Client
from tests.conftest import job_spec, script

pytestmark = pytest.mark.e2e  # a real server, agents and processes


async def test_the_blocking_client_submits_waits_and_reads_logs(
    cluster: DevCluster, tmp_path: Path
) -> None:
    leader = script(tmp_path, "hi", "print('hi from the leader')\n")
    sleep = script(tmp_path, "sleep", "import signal; signal.pause()  # runs until stopped\n")

    def use() -> tuple[str, str, bytes, list[str]]:
        with Client(cluster.address) as client:
            job = client.submit(job_spec("sync-job", leader=leader, worker=sleep))
            done = client.wait(job.metadata.name, timeout_s=30)
            logs = b"".join(client.logs("sync-job"))
            names = [j.name for j in client.jobs()]
            again = client.submit(job_spec("sync-job", leader=leader))  # it has ended
            assert again.metadata.id != job.metadata.id
            with pytest.raises(ArrangerError) as caught:  # this one has not
                client.submit(job_spec("sync-job", leader=leader))
            assert caught.value.code == grpc.StatusCode.ALREADY_EXISTS
            client.wait(again.metadata.id, timeout_s=30)
            assert client.get("sync-job").metadata.id == again.metadata.id
            return done.status.stage, done.status.reason, logs, names

    stage, reason, logs, names = await asyncio.to_thread(use)
    assert (stage, reason) == ("Succeeded", "LeaderSucceeded")
    assert logs == b"hi from the leader\n" and names == ["sync-job"]


async def test_a_job_can_be_given_as_yaml_text(cluster: DevCluster) -> None:
    text = (
        "metadata: {name: from-text}\nspec:\n  leader: {name: l, template: {command: ['true']}}\n"
        "  workerSets: [{name: w, template: {command: ['true'], resources: {cpu: 10m}}}]\n"
    )

    def submit() -> str:
        with Client(cluster.address) as client:
            return client.submit(text).spec.worker_sets[0].template.resources.cpu.__repr__()

    assert await asyncio.to_thread(submit) == "0.01"
