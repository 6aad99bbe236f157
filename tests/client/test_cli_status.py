"""What `arranger list` and `arranger get` show is the job as it is now: the running-workers
message is counted when shown, and get gives every job's and pod's start, finish and elapsed
time. The CLI as a real process against a real cluster."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from tests.client.test_cli import arranger
from tests.conftest import Gate, eventually, job_spec, script

pytestmark = pytest.mark.e2e  # a real server, agents and processes

CLOCK = r"\d\d:\d\d:\d\d"


async def test_the_workers_message_is_counted_when_shown(
    cluster: DevCluster, gate: Gate, tmp_path: Path
) -> None:
    server = cluster.address
    idle = script(tmp_path, "idle", "import signal\nsignal.pause()\n")
    spec = job_spec("counted", leader=idle, workers=1)
    quick = {
        "name": "quick",
        "counts": 1,
        "template": {
            "command": gate.command(tmp_path),
            "resources": {"cpu": 0.1, "memory": "64Mi"},
        },
    }
    spec["spec"]["workerSets"].append(quick)
    async with AsyncClient(server) as client:
        await client.submit(spec)

        async def running(workers: int) -> bool:
            status = (await client.get("counted")).status
            return status.stage == "Running" and status.running_workers == workers

        await eventually(lambda: running(2), what="both workers running")
        rc, out, _ = await arranger("list", server=server)
        assert re.search(r"counted .* 2/2 .* leader and 2 of 2 workers running", out), out
        gate.open()
        await eventually(lambda: running(1), what="the quick worker to finish")
    rc, out, _ = await arranger("list", server=server)
    assert re.search(r"counted .* 1/2 .* leader and 1 of 2 workers running", out), out
    rc, out, err = await arranger("get", "counted", server=server)
    assert rc == 0, err
    out = "\n".join(line.rstrip() for line in out.splitlines()) + "\n"  # rich pads the grid
    assert re.search(r"Reason +Running: leader and 1 of 2 workers running", out), out
    assert re.search(rf"Started +{CLOCK}\n", out) and re.search(r"Finished +-\n", out), out
    assert re.search(r"Elapsed +\d+s \(running\)", out), out
    assert re.search(rf"counted-learner .* Running +0 +- +{CLOCK} +- +\d+s", out), out
    assert re.search(rf"counted-quick-0 .* Succeeded +0 +0 +{CLOCK} +{CLOCK} +\d+s", out), out
