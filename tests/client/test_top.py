"""`arranger top` against a real dev server with a real running job: every unfinished job's
usage beside its request, one job's pods, and Ctrl-C ends the live view quietly with 130."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from tests.client.test_cli_interrupt import (  # sigint_not_ignored: an autouse fixture
    EXIT_INTERRUPTED,
    interrupted,
    sigint_not_ignored,  # noqa: F401
)
from tests.conftest import eventually, job_spec

pytestmark = pytest.mark.e2e  # a real server, agents and processes

SPINS = [sys.executable, "-c", "while True: pass"]
SLEEPS = [sys.executable, "-c", "import signal; signal.pause()"]  # runs until stopped


def top(server: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "arranger.client.cli", "--server", server, "top", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and not done.stderr, done.stderr
    return done.stdout


async def test_top_shows_usage_of_jobs_and_of_pods(
    cluster: DevCluster, client: AsyncClient
) -> None:
    await client.submit(job_spec("busy", SPINS, worker=SLEEPS, workers=2, cpu=0.5))

    async def sampled() -> bool:
        status = (await client.get("busy")).status
        pods = [status.leader, *status.workers]
        return all(p.HasField("usage") for p in pods) and status.leader.usage.cpu_cores > 0.2

    await eventually(sampled, timeout_s=30, what="every pod's usage")
    jobs = await asyncio.to_thread(top, cluster.address, "--once")
    [line] = [line for line in jobs.splitlines() if line.startswith("busy")]
    assert "Running" in line and " / 1.5" in line  # cores used / the 3 pods' 0.5 each

    pods = await asyncio.to_thread(top, cluster.address, "busy", "--once")
    rows = [line for line in pods.splitlines() if line.startswith("busy-")]
    assert [row.split()[0] for row in rows] == ["busy-learner", "busy-actors-0", "busy-actors-1"]
    assert all(" / 0.5" in row and "dev-" in row for row in rows)
    assert "- /" not in pods  # every pod was sampled


async def test_ctrl_c_ends_top_quietly(cluster: DevCluster, client: AsyncClient) -> None:
    await client.submit(job_spec("quiet", SLEEPS))
    status, err = await interrupted(cluster.address, "top", "--every", "0.2", first=b"quiet")
    assert status == EXIT_INTERRUPTED
    assert b"Traceback" not in err, err.decode()
