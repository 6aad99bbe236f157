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


async def test_run_submits_a_command_without_a_file(
    cluster: DevCluster, client: AsyncClient, tmp_path: Path
) -> None:
    server = cluster.address
    said = tmp_path / "said"
    rc, out, err = await arranger(
        "run",
        "--name",
        "oneliner",
        "--cpu",
        "0.2",
        "--memory",
        "64Mi",
        "--wait",
        "--",
        "sh",
        "-c",
        f"echo learner >> {said}",
        server=server,
    )
    assert rc == 0 and "job oneliner submitted" in out, (out, err)
    assert said.read_text() == "learner\n"
    job = await client.get("oneliner")
    leader = job.spec.leader.template
    assert list(leader.command) == ["sh", "-c", f"echo learner >> {said}"]
    assert leader.resources.cpu == 0.2 and not job.spec.worker_sets

    rc, out, err = await arranger(
        "run",
        "--actors",
        "2",
        "--actor-command",
        f"sh -c 'echo actor >> {said}'",
        "--cpu",
        "0.1",
        "--memory",
        "64Mi",
        "--set",
        "spec.priority=7",
        "--wait",
        "--",
        "sh",
        "-c",  # the learner ends once both actors have spoken
        f'until [ "$(grep -c actor {said})" -ge 2 ]; do sleep 0.05; done',
        server=server,
    )
    assert rc == 0, (out, err)
    name = out.split("job ", 1)[1].split(" ", 1)[0]
    assert name.startswith("sh-") and len(name) == len("sh-") + 4
    job = await client.get(name)
    assert job.spec.priority == 7 and [ws.counts for ws in job.spec.worker_sets] == [2]
    assert said.read_text().count("actor") == 2

    rc, out, err = await arranger("run", "--cpu", "lots", "--", "true", server=server)
    assert rc == 1 and "spec.leader.template.resources.cpu" in err, err
    rc, out, err = await arranger("run", "--name", "x", server=server)
    assert rc == 2 and "no command" in err, err


async def test_wait_shows_the_learners_log_each_attempt_once(
    cluster: DevCluster, tmp_path: Path
) -> None:
    flaky = script(
        tmp_path,
        "flaky",
        "import os, sys\n"
        "attempt = os.environ['ARRANGER_RESTART_COUNT']\n"
        "print(f'line of attempt {attempt}', flush=True)\n"
        "sys.exit(1 if attempt == '0' else 0)\n",
    )
    rc, out, err = await arranger(
        "run",
        "--name",
        "twice",
        "--cpu",
        "0.1",
        "--memory",
        "64Mi",
        "--set",
        "spec.restartLimit=2",
        "--wait",
        "--",
        *flaky,
        server=cluster.address,
    )
    assert rc == 0, (out, err)
    assert out.count("line of attempt 0\n") == 1 and out.count("line of attempt 1\n") == 1, out
    assert out.index("line of attempt 0") < out.index("line of attempt 1")
    assert "[arranger: twice-learner attempt 1]" in err, err
