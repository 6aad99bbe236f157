"""`arranger submit` as a user runs it: from standard input, with every mistake of a spec at
once, and with a warning when the job cannot run on the cluster as it is (it is queued all
the same). A real process against a real cluster (2 nodes of 4 cores, 8 GiB, no GPU)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import yaml

from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from tests.client.test_cli import arranger
from tests.conftest import job_spec

pytestmark = pytest.mark.e2e  # a real server, agents and processes


async def arranger_stdin(text: str, *args: str, server: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "arranger.client.cli",
        "--server",
        server,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(text.encode()), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_submit_reads_standard_input(cluster: DevCluster) -> None:
    text = yaml.safe_dump(job_spec("piped", leader=["true"]))
    rc, out, err = await arranger_stdin(text, "submit", "-", server=cluster.address)
    assert rc == 0 and "job piped submitted" in out, err
    async with AsyncClient(cluster.address) as client:
        assert (await client.get("piped")).metadata.name == "piped"


async def test_every_mistake_of_a_spec_is_one_line_at_once(
    cluster: DevCluster, tmp_path: Path
) -> None:
    text = """
metadata: {name: x, labels: [team]}
spec:
  priorty: 3
  leader:
    name: learner
    template:
      command: python learner.py
      env: {LR: {value: 1}}
      resources: {cpu: lots, memory: 1Gi, gpu: one}
  workerSets:
    - {name: actors, counts: 2.5, template: {command: [python, actor.py]}}
"""
    rc, out, err = await arranger_stdin(text, "submit", "-", server=cluster.address)
    assert rc == 1 and out == ""
    assert sorted(err.splitlines()) == sorted(
        [
            "error: <stdin>: metadata.labels: expected a mapping of names to strings, got a list",
            "error: <stdin>: spec.priorty: unknown field (did you mean 'priority'?)",
            "error: <stdin>: spec.leader.template.command: expected a list of strings, got the "
            "string 'python learner.py'; write it as a list: [python, learner.py]",
            "error: <stdin>: spec.leader.template.env.LR: expected a string, got a mapping",
            "error: <stdin>: spec.leader.template.resources.cpu: expected cores: a number, or "
            "milli-cores like 500m, got the string 'lots'",
            "error: <stdin>: spec.leader.template.resources.gpu: expected a number, got the string "
            "'one'",
            "error: <stdin>: spec.workerSets[0].counts: expected a whole number, got the number 2.5",
        ]
    )
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text(
        yaml.safe_dump(job_spec("Bad_Name", leader=["true"], priority=42, restartLimit=-1))
    )
    rc, _, err = await arranger("submit", str(invalid), server=cluster.address)
    lines = err.splitlines()
    assert rc == 1 and len(lines) == 3, err
    assert all(line.startswith("error: ") for line in lines), err
    assert "error: spec.priority: must be between 1 and 10" in lines


async def test_submit_refuses_a_job_no_node_could_hold_unless_queued_anyway(
    cluster: DevCluster,
) -> None:
    too_big = yaml.safe_dump(
        job_spec("hungry", leader=["true"], workers=12, cpu=1, minWorkersNum=12)
    )
    rc, out, err = await arranger_stdin(too_big, "submit", "-", server=cluster.address)
    assert rc == 1 and out == "", err
    assert (
        err.startswith(
            "error: spec.workerSets: the gang minimum (13 pods) needs 13 CPUs (the cluster has 8 in "
            "all) on 2 registered nodes; it could never run on the 2 registered nodes"
        )
        and "--queue-anyway" in err
    ), err
    rc, out, err = await arranger_stdin(
        too_big, "submit", "-", "--queue-anyway", server=cluster.address
    )
    assert rc == 0 and "job hungry submitted" in out, err
    assert err.splitlines() == [
        "warning: the gang minimum (13 pods) needs 13 CPUs (the cluster has 8 in all) on 2 "
        "Ready nodes"
    ]
    gpu = job_spec("gpu-hungry", leader=["true"])
    gpu["spec"]["leader"]["template"]["resources"].update(gpu=4, cpu=64, memory="1Ti")
    rc, out, err = await arranger_stdin(
        yaml.safe_dump(gpu), "submit", "-", "--queue-anyway", server=cluster.address
    )
    assert rc == 0 and err.splitlines() == [
        "warning: the leader needs 64 CPUs (the largest node has 4 CPUs), 1Ti of memory (the "
        "largest node has 8Gi) and 4 GPUs (the largest node has 0 GPUs)"
    ], err
    fits = yaml.safe_dump(job_spec("modest", leader=["true"]))
    rc, out, err = await arranger_stdin(fits, "submit", "-", server=cluster.address)
    assert rc == 0 and err == "", err
    async with AsyncClient(cluster.address) as client:
        assert (await client.get("hungry")).metadata.name == "hungry"  # queued all the same
