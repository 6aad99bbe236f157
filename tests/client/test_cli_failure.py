"""A failed job explains itself: its message names how the failing pod ended (exit code and
signal), `get` and `submit --wait` print the last lines of that pod's log, and `logs` (and the
dashboard's log) without an attempt show the newest attempt that has a log, saying which. The
CLI as a real process against a real cluster."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import yaml

from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from arranger.server.controller import ControllerConfig
from tests.client.test_cli import arranger
from tests.conftest import FAST, Gate, eventually, job_spec, running_cluster, script

pytestmark = pytest.mark.e2e  # a real server, agents and processes

# Fifteen numbered lines, then the program ends itself with SIGTERM (exit code 143).
SELF_TERMINATING = """
import os, signal
for i in range(15):
    print(f"step {i}", flush=True)
os.kill(os.getpid(), signal.SIGTERM)
"""

# No restart is launched in a test's time: a failed pod's next attempt waits, without a log.
SLOW_RESTARTS = dataclasses.replace(
    FAST,
    controller=dataclasses.replace(FAST.controller, backoff_initial_s=600.0, backoff_max_s=600.0),
)
assert isinstance(SLOW_RESTARTS.controller, ControllerConfig)


@pytest.fixture
async def slow_restarts(tmp_path: Path) -> AsyncIterator[DevCluster]:
    async with running_cluster(tmp_path / "cluster", config=SLOW_RESTARTS) as c:
        yield c


async def test_a_failed_leader_names_its_signal_and_its_log_tail_is_printed(
    cluster: DevCluster, tmp_path: Path
) -> None:
    server = cluster.address
    spec = job_spec("doomed", leader=script(tmp_path, "doomed", SELF_TERMINATING), restartLimit=0)
    del spec["spec"]["workerSets"]
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(spec))
    rc, out, err = await arranger("submit", str(job_file), "--wait", server=server)
    assert rc == 1, err
    assert "doomed-learner ended failed with exit code 143 (SIGTERM) after 0 restarts" in out
    tail = out.split("last lines of doomed-learner attempt 0:\n", 1)[1].splitlines()
    assert tail == [f"  step {i}" for i in range(5, 15)]
    rc, out, err = await arranger("get", "doomed", server=server)
    assert rc == 0, err
    assert "exit code 143 (SIGTERM)" in out
    assert out.rstrip().endswith("  step 14") and "  step 4\n" not in out


async def test_too_few_workers_names_the_last_worker_and_prints_its_log(
    cluster: DevCluster, tmp_path: Path, gate: Gate
) -> None:
    server = cluster.address
    actor = script(tmp_path, "actor", "print('Traceback: no actor.py here')\nraise SystemExit(3)\n")
    spec = job_spec("few", leader=gate.command(tmp_path), worker=actor, restartLimit=0)
    async with AsyncClient(server) as client:
        await client.submit(spec)
        done = await client.wait("few", timeout_s=60)
    assert done.status.reason == "TooFewWorkers"
    assert done.status.message.endswith("; last few-actors-0 failed with exit code 3")
    rc, out, err = await arranger("get", "few", server=server)
    assert rc == 0, err
    assert "last lines of few-actors-0 attempt 0:\n  Traceback: no actor.py here" in out


async def test_logs_show_the_newest_attempt_that_has_a_log(
    slow_restarts: DevCluster, tmp_path: Path, gate: Gate
) -> None:
    cluster = slow_restarts
    server = cluster.address
    actor = script(tmp_path, "actor", "print('Traceback: the first try', flush=True)\nexit(2)\n")
    spec = job_spec("again", leader=gate.command(tmp_path), worker=actor, restartLimit=3)
    view = cluster.server.controller.view
    async with AsyncClient(server) as client:
        await client.submit(spec)

        def waits_for_its_restart() -> bool:
            job = view.find("again")
            return job is not None and job.pods["again-actors-0"].attempt == 1

        await eventually(waits_for_its_restart, what="the actor's second attempt, waiting")
    rc, out, err = await arranger("logs", "again", "--pod", "actors-0", server=server)
    assert rc == 0, err
    assert out == "Traceback: the first try\n"
    assert "[arranger: again-actors-0 attempt 0, the newest with a log (attempt 1 has none)]" in err
    rc, out, err = await arranger(
        "logs", "again", "--pod", "actors-0", "--attempt", "1", server=server
    )
    assert rc == 1 and "no log for attempt 1" in err
    rc, out, err = await arranger("logs", "again", server=server)  # one attempt: no word
    assert rc == 0 and "[arranger:" not in err

    job = view.find("again")
    url = f"{cluster.server.web.url}/api/jobs/{job.id}/log"
    pod = {"pod": "again-actors-0"}
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.get(cluster.dashboard_url) as login:  # dev's printed URL logs in
            assert login.status == 200
        async with http.get(url, params=pod) as reply:
            piece = await reply.json()
        assert (piece["attempt"], piece["latest"]) == (0, 1)
        assert piece["text"] == "Traceback: the first try\n"
        async with http.get(url, params={**pod, "attempt": "1"}) as reply:
            piece = await reply.json()
        assert piece["attempt"] == 1 and piece["text"] == "" and "no log" in piece["note"]
        for wrong in ("2", "-1", "x", "9" * 4000, "²"):
            async with http.get(url, params={**pod, "attempt": wrong}) as reply:
                assert reply.status == 400
                assert (await reply.text()).startswith("attempt: ")
