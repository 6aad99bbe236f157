"""`arranger submit --wait` exits with the job's outcome (0 completed, 1 failed, 3 stopped or
deleted), and `--set` changes the file's fields on the way. A real server and agents, the
real CLI in a process of its own."""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml

from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from tests.client.test_cli import arranger
from tests.conftest import Gate, eventually, job_spec, script


async def test_wait_exits_with_the_outcome_and_set_changes_fields(
    cluster: DevCluster, client: AsyncClient, tmp_path: Path, gate: Gate
) -> None:
    server = cluster.address
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job_spec("base", leader=["true"], worker=["true"])))
    rc, out, err = await arranger(
        "submit", str(job_file), "--wait", "--set", "metadata.name=done", server=server
    )
    assert rc == 0, err
    code = script(tmp_path, "fails", "raise SystemExit(4)\n")
    rc, out, err = await arranger(
        "submit",
        str(job_file),
        "--wait",
        "--set",
        "metadata.name=fails",
        "--set",
        f"spec.leader.template.command={code}",
        "--set",
        "spec.restartLimit=0",
        server=server,
    )
    assert rc == 1 and "exit code 4" in out, (out, err)

    # Stopped while waited on: 3. Two workers, set on the command line.
    held = gate.command(tmp_path)
    waiting = asyncio.create_task(
        arranger(
            "submit",
            str(job_file),
            "--wait",
            "--set",
            "metadata.name=stopped",
            "--set",
            f"spec.leader.template.command={held}",
            "--set",
            "spec.workerSets[0].counts=2",
            server=server,
        )
    )

    async def running() -> bool:
        jobs = {j.name: j for j in await client.jobs()}
        return "stopped" in jobs and jobs["stopped"].progress.stage == "Running"

    await eventually(running, what="the job to run")
    assert [ws.counts for ws in (await client.get("stopped")).spec.worker_sets] == [2]
    await client.stop("stopped")
    gate.open()
    rc, out, err = await waiting
    assert rc == 3, (out, err)

    # A --set the file cannot take: one line naming it, nothing submitted.
    rc, out, err = await arranger(
        "submit", str(job_file), "--set", "spec.workerSets[3].counts=1", server=server
    )
    assert rc == 1 and "--set 'spec.workerSets[3].counts=1'" in err, err
