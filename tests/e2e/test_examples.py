"""The CartPole RL example through Arranger, and `arranger dev --demo` as a user runs it."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from arranger.client.dev import demo_job
from arranger.client.sdk import AsyncClient
from tests.conftest import eventually


async def test_cartpole_learner_and_actors_succeed_through_the_scheduler(
    client: AsyncClient,
) -> None:
    job = demo_job()
    command = job.spec.leader.template.command
    command[list(command).index("--target") + 1] = "150"  # a lower bar keeps the suite quick
    await client.submit(job)
    done = await client.wait("cartpole", timeout_s=110)
    log = b"".join([chunk async for chunk in client.logs("cartpole")]).decode()
    assert done.status.stage == "Succeeded", f"{done.status.message}\n{log}"
    assert "solved: avg_return=" in log
    assert "actor rank=3 connected" in log

    async def actors_ended() -> bool:  # they exit 0 on the learner's close, or are stopped
        workers = (await client.get("cartpole")).status.workers
        return all(w.state in ("Succeeded", "Killed") for w in workers)

    await eventually(actors_ended, what="every actor to end")


async def test_arranger_dev_demo_succeeds_from_any_directory(tmp_path: Path) -> None:
    arranger = Path(sys.executable).parent / "arranger"
    argv = [str(arranger)] if arranger.exists() else [sys.executable, "-m", "arranger.client.cli"]
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    proc = await asyncio.create_subprocess_exec(
        *argv, "dev", "--demo", "--port", "0", cwd=tmp_path, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
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
