"""Stalls end to end: real learners and actors, run by real agents, say their progress through
the in-job SDK (job.report, job.heartbeat); one that reported and then blocks (as in a hung
collective) is found Stalled after its role's progressTimeoutSeconds, and its onStall holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from arranger.client.sdk import AsyncClient
from tests.conftest import job_spec, script
from tests.e2e.test_job_reports import REPO

# Reports a few steps, then blocks forever, as a learner stuck in a collective would.
HANGS = """
import signal
from arranger.job import current
with current(report_interval_s=0.2) as job:
    for step in range(3):
        job.report(step, loss=1.0 / (step + 1))
    job.flush()
    signal.pause()
"""

# Attempt 0 reports once and blocks; a later attempt says it runs (a file) and heartbeats.
ACTOR = """
import os, pathlib, signal, time
from arranger.job import current
attempt = int(os.environ["ARRANGER_RESTART_COUNT"])
with current(report_interval_s=0.2) as job:
    job.heartbeat()
    job.flush()
    if attempt == 0:
        signal.pause()  # blocks until stopped, as a hung environment would
    pathlib.Path(os.environ["OUT"], "restarted").write_text(str(attempt))
    while True:
        job.heartbeat()
        time.sleep(0.2)
"""

LEARNER_WAITS = """
import os, pathlib, time
from arranger.job import current
marker = pathlib.Path(os.environ["OUT"], "restarted")
with current(report_interval_s=0.2) as job:
    while not marker.exists():
        job.heartbeat()
        time.sleep(0.2)
    for _ in range(10):  # the restarted actor's heartbeats keep it from stalling again
        job.heartbeat()
        time.sleep(0.2)
"""


def with_sdk(doc: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
    """with_sdk: the job's pods import the SDK under test."""
    for template in [doc["spec"]["leader"]["template"]] + [
        ws["template"] for ws in doc["spec"]["workerSets"]
    ]:
        template["env"] = {"PYTHONPATH": REPO, **(env or {})}
    return doc


async def test_a_learner_that_blocks_after_reporting_is_stalled_and_fails_its_job(
    client: AsyncClient, tmp_path: Path
) -> None:
    doc = with_sdk(job_spec("hung", script(tmp_path, "hangs", HANGS)))
    doc["spec"]["workerSets"] = []
    doc["spec"]["minWorkersNum"] = 0
    doc["spec"]["leader"].update(progressTimeoutSeconds=2, onStall="fail")
    await client.submit(doc)
    done = await client.wait("hung", timeout_s=60)
    st = done.status
    assert st.stage == "Failed" and st.reason == "Stalled", st.message
    assert st.message == "hung-learner reported no progress (onStall: fail)"
    stalled = [e for e in await client.events("hung") if e.kind == "Stalled"]
    assert len(stalled) == 1 and stalled[0].pod == "hung-learner"
    assert "(progressTimeoutSeconds 2; onStall: fail)" in stalled[0].message


async def test_an_actor_stalled_with_on_stall_restart_runs_again_spending_a_restart(
    client: AsyncClient, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    doc = job_spec(
        "stuck",
        script(tmp_path, "learner", LEARNER_WAITS),
        script(tmp_path, "actor", ACTOR),
        restartLimit=1,
    )
    with_sdk(doc, {"OUT": str(out)})
    doc["spec"]["leader"].update(progressTimeoutSeconds=5)
    doc["spec"]["workerSets"][0].update(progressTimeoutSeconds=2, onStall="restart")
    await client.submit(doc)
    done = await client.wait("stuck", timeout_s=90)
    st = done.status
    assert st.stage == "Succeeded", st.message
    assert (out / "restarted").read_text() == "1"
    assert st.worker_set_restarts["actors"] == 1 and st.leader_restarts == 0
    kinds = [(e.kind, e.pod) for e in await client.events("stuck")]
    assert ("Stalled", "stuck-actors-0") in kinds and ("Restarting", "stuck-actors-0") in kinds
    assert ("Stalled", "stuck-learner") not in kinds  # its heartbeats are progress
