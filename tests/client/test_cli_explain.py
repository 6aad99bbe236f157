"""`arranger explain` names the jobs ahead of a waiting one in its queue: the CLI as a real
process against a real cluster that a high-priority job fills."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from tests.client.test_cli import arranger
from tests.conftest import eventually, job_spec, script

pytestmark = pytest.mark.e2e  # a real server, agents and processes


async def test_explain_names_the_jobs_ahead(
    cluster: DevCluster, client: AsyncClient, tmp_path: Path
) -> None:
    sleep = script(tmp_path, "s", "import signal\nsignal.pause()\n")
    await client.submit(job_spec("hog", leader=sleep, workers=6, cpu=1, priority=9))
    await client.wait("hog", stages=["Running"], timeout_s=30)
    for priority in range(1, 8):  # each needs 2 cores; 1 is free
        await client.submit(job_spec(f"w{priority}", leader=sleep, cpu=1, priority=priority))

    async def all_waiting() -> bool:
        reply = await client.explain("w1")
        return reply.queue_waiting == 7 and reply.queue_position == 7

    await eventually(all_waiting, what="the seven waiting jobs in order")
    reply = await client.explain("w1")
    assert list(reply.ahead) == ["w7", "w6", "w5", "w4", "w3"] and reply.ahead_more == 1
    rc, out, err = await arranger("explain", "w1", server=cluster.address)
    assert rc == 0, err
    assert re.search(r"Ahead of it +w7, w6, w5, w4, w3, and 1 more", out), out
    rc, out, err = await arranger("explain", "w7", server=cluster.address)
    assert rc == 0 and "Ahead of it" not in out, out
