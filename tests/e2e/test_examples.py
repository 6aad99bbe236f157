"""The CartPole RL example through Arranger, and `arranger dev --demo` as a user runs it."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
from pathlib import Path

from arranger.client.dev import demo_job
from arranger.client.sdk import ArrangerError, AsyncClient
from arranger.v1 import job_pb2
from tests.conftest import Gate, eventually, job_spec, running_cluster

REPO_ROOT = Path(__file__).resolve().parents[2]


def cartpole(target: str, *learner_args: str) -> job_pb2.TYJob:
    """cartpole: the packaged job with a lower target (a quick suite), its pods running this
    checkout's code (the agents pass on no PYTHONPATH of their own)."""
    job = demo_job()
    command = job.spec.leader.template.command
    command[list(command).index("--target") + 1] = target
    command.extend(learner_args)
    for template in [job.spec.leader.template, *(ws.template for ws in job.spec.worker_sets)]:
        template.env["PYTHONPATH"] = str(REPO_ROOT)
    return job


async def log_of(client: AsyncClient, job: str, attempt: int | None = None) -> str:
    """log_of: the learner's log, of one attempt (None: the latest)."""
    return b"".join([c async for c in client.logs(job, attempt=attempt)]).decode()


async def test_cartpole_learner_and_actors_succeed_through_the_scheduler(
    client: AsyncClient,
) -> None:
    # Every 5 updates the learner finds its return rose too slowly (by less than 1000) and
    # asks for one more actor, through its job token, while every actor it wants is connected.
    await client.submit(cartpole("475", "--scale-every", "5", "--scale-min-gain", "1000"))
    done = await client.wait("cartpole", timeout_s=110)
    log = await log_of(client, "cartpole")
    assert done.status.stage == "Succeeded", f"{done.status.message}\n{log}"
    assert "solved: avg_return=" in log
    assert "actor rank=1 connected" in log
    assert "learner: elastic: 2 of up to 6 actors wanted" in log
    assert "no checkpoint in " in log and "Traceback" not in log
    assert "in 5 updates: actors 2 -> 3 (of 6)" in log, log
    actors, evaluator = done.spec.worker_sets
    assert 3 <= actors.counts <= 6 and actors.max_counts == 6
    names = [w.name for w in done.status.workers]
    assert [n for n in names if "-actors-" in n][:3] == [f"cartpole-actors-{i}" for i in range(3)]
    assert evaluator.auxiliary and evaluator.start_after == "leaderReady"
    (reports,) = await client.get_reports("cartpole")
    assert "avg_return" in {series.key for series in reports.series}  # the learner's progress

    async def actors_ended() -> bool:  # they exit 0 on the learner's close, or are stopped
        workers = (await client.get("cartpole")).status.workers
        return all(w.state in ("Succeeded", "Killed") for w in workers)

    await eventually(actors_ended, what="every actor to end")


async def test_cartpole_evaluator_scores_the_learners_policy_and_reports_it(
    client: AsyncClient,
) -> None:
    """The helper role: a learner paused at version 10 never ends by itself, so its evaluator
    (auxiliary, started once the learner said it was ready) surely connects, scores version
    10 greedily and reports it; the learner serves it weights and never counts it an actor.
    Stopped, the job ends as the leader decided."""
    await client.submit(cartpole("475", "--pause-at-version", "10"))

    async def scored() -> bool:
        try:
            said = b"".join([c async for c in client.logs("cartpole", "cartpole-evaluator-0")])
        except ArrangerError:  # not placed, or not started, yet
            return False
        return b"evaluator: version=10 eval_return=" in said

    await eventually(scored, timeout_s=60, what="the evaluator to score version 10")
    log = await log_of(client, "cartpole")
    assert "learner: evaluator rank=6 connected" in log and "learner: evaluator: version=" in log
    assert "elastic: 2 of up to 6 actors wanted" in log

    async def reported() -> bool:
        (reports,) = await client.get_reports("cartpole")
        return {"avg_return", "eval_return"} <= {series.key for series in reports.series}

    await eventually(reported, what="the learner's and the evaluator's reports")
    await client.stop("cartpole")
    done = await client.wait("cartpole", timeout_s=60)
    assert done.status.stage == "Succeeded" and done.status.reason == "Stopped"


async def test_cartpole_checkpoints_on_an_eviction_notice_and_resumes_where_it_stopped(
    tmp_path: Path, gate: Gate
) -> None:
    """One node (4 cores): the learner's scratch directory, where it checkpoints, outlives
    an eviction on its node only, so the job must come back to the same node. A job of
    priority 8 that needs the whole node evicts the paused learner and its actors with 30 s
    of notice; the learner checkpoints, confirms, is stopped, and once the big job ends it
    resumes from the checkpoint and reaches the target."""
    async with (
        running_cluster(tmp_path / "cluster", agents=1) as cluster,
        AsyncClient(cluster.address, timeout_s=10) as client,
    ):
        await client.submit(cartpole("150", "--pause-at-version", "10"))
        await client.wait("cartpole", stages=["Running"], timeout_s=30)

        async def paused() -> bool:
            return "paused at version=10" in await log_of(client, "cartpole")

        await eventually(paused, what="the learner to pause at version 10")
        big = job_spec("big", gate.command(tmp_path), cpu=2, priority=8, minWorkersNum=1)
        submitted = time.time()
        await client.submit(big)  # 4 cores: all of the node's
        await client.wait("big", stages=["Running"], timeout_s=30)
        evicted = await client.get("cartpole")
        assert evicted.status.stage == "Pending", evicted.status
        assert evicted.status.leader.state == "Pending" and evicted.status.leader.attempt == 1
        events = {e.kind: e for e in await client.events("cartpole")}
        assert "the learner may confirm a checkpoint" in events["EvictionNotice"].message
        assert "the learner confirmed a checkpoint" in events["Checkpointed"].message

        released = time.time()
        gate.open()
        done = await client.wait("cartpole", timeout_s=110)
        # Only now: an attempt's log is read from the node the pod is placed on.
        first = await log_of(client, "cartpole", attempt=0)
        second = await log_of(client, "cartpole", attempt=1)
        assert done.status.stage == "Succeeded", f"{done.status.message}\n{first}\n{second}"
        assert "learner: eviction notice: the job goes in " in first, first
        saved = re.search(
            r"checkpoint saved \(eviction notice\) .* version=(\d+) .* in (\d+) ms", first
        )
        assert saved and int(saved.group(1)) == 10, first
        assert "checkpoint confirmed" in first and "SIGTERM: checkpointing and exiting" in first
        resumed = re.search(r"resumed from checkpoint (\S+) at version=(\d+)", second)
        assert resumed and int(resumed.group(2)) == 10, second
        assert "solved: avg_return=" in second and "Traceback" not in first + second
        assert done.status.leader.attempt == 1 and done.status.leader_restarts == 0

        notice = events["EvictionNotice"].time.ToNanoseconds() / 1e9
        confirmed = events["Checkpointed"].time.ToNanoseconds() / 1e9
        restarted = done.status.leader.start_time.ToNanoseconds() / 1e9
        print(
            f"\nnotice {notice - submitted:.2f} s after the submit; checkpoint confirmed "
            f"{confirmed - notice:.2f} s after the notice (saved in {saved.group(2)} ms); "
            f"learner running again {restarted - released:.2f} s after the room came back"
        )


async def test_arranger_dev_demo_succeeds_from_any_directory(tmp_path: Path) -> None:
    arranger = Path(sys.executable).parent / "arranger"
    argv = [str(arranger)] if arranger.exists() else [sys.executable, "-m", "arranger.client.cli"]
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    proc = await asyncio.create_subprocess_exec(
        *argv,
        "dev",
        "--demo",
        "--port",
        "0",
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = await asyncio.wait_for(proc.communicate(), 150)
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    text = output.decode()
    assert proc.returncode == 0, text
    assert "demo succeeded" in text and "learner | solved:" in text
    assert "Traceback" not in text
