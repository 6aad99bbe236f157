"""Preemption on a real cluster: a high-priority job takes a low-priority job's surplus
workers, which get SIGTERM and their grace; both jobs end up running."""

from __future__ import annotations

from pathlib import Path

from arranger.client.sdk import AsyncClient
from tests.conftest import eventually, job_spec, script

GRACEFUL = """
import os, pathlib, signal, sys
out = pathlib.Path(os.environ["ARRANGER_VOLUME_OUT"])
name = os.environ["ARRANGER_POD_NAME"]
def stop(signum, frame):
    (out / f"{name}.term").write_text(os.environ["ARRANGER_PREEMPTION_GRACE_S"])
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
(out / f"{name}.ready").touch()
while True:
    signal.pause()
"""


async def test_a_high_priority_job_preempts_surplus_workers_and_both_run(
    client: AsyncClient, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    graceful = script(tmp_path, "graceful", GRACEFUL)
    low = job_spec(
        "low",
        leader=graceful,
        workers=6,
        cpu=1,
        priority=2,
        minWorkersNum=1,
        preemptionGraceSeconds=3,
        volumes=[{"name": "out", "hostPath": str(out)}],
    )
    await client.submit(low)  # 7 of the cluster's 8 cores
    await client.wait("low", stages=["Running"], timeout_s=30)

    await eventually(
        lambda: len(list(out.glob("low-*.ready"))) == 7, what="all of low's pods to be ready"
    )
    # Surplus workers go newest first: the two started last (on a loaded machine not always
    # the highest indexes), names breaking a tie.
    started = (await client.get("low")).status.workers
    surplus = sorted(started[1:], key=lambda w: (-w.start_time.ToNanoseconds(), w.name))
    newest = sorted(w.name for w in surplus[:2])
    high = job_spec(
        "high",
        leader=graceful,
        workers=2,
        cpu=1,
        priority=8,
        minWorkersNum=2,
        volumes=[{"name": "out", "hostPath": str(out)}],
    )
    await client.submit(high)
    await client.wait("high", stages=["Running"], timeout_s=30)

    low_now = (await client.get("low")).status
    assert low_now.stage == "Running" and low_now.running_workers == 4
    assert low_now.leader.state == "Running" and low_now.worker_set_restarts == {}
    preempted = [w for w in low_now.workers if w.state == "Pending"]
    assert sorted(w.name for w in preempted) == newest
    assert low_now.schedule_state == "ScheduledPartly"
    assert all((out / f"{w.name}.term").read_text() == "3" for w in preempted), (
        "SIGTERM with the grace"
    )
    events = [e for e in await client.events("low") if e.kind == "Preempted"]
    assert (
        len(events) == 1
        and "preempted by job high (priority 8, queue default)" in events[0].message
    )
    for name in ("high", "low"):
        await client.delete(name)
