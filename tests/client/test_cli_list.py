"""`arranger list` as a user runs it (an ID column, unfinished jobs unless --all, stages in any
case), GPU 0 shown as an index in JSON, and submit's warning of a local file nothing ships:
a real process against a real cluster."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
import yaml

from arranger.client.sdk import AsyncClient
from arranger.v1 import node_pb2
from tests.client.test_cli import arranger
from tests.conftest import bare_server, eventually, job_spec, running_cluster
from tests.played_agent import AnsweringAgent, played_agent, registration

pytestmark = pytest.mark.e2e  # a real server, agents and processes

GPU0 = node_pb2.Gpu(index=0, uuid="GPU-0", model="FakeGPU", memory=2**34, fake=True)


async def test_list_shows_ids_and_unfinished_jobs_unless_all(tmp_path: Path) -> None:
    async with bare_server(tmp_path / "server") as bare:
        server = f"127.0.0.1:{bare.port}"
        async with (
            played_agent(server, registration("n0", gpus=[GPU0])) as stream,
            AsyncClient(server) as client,
        ):
            agent = AnsweringAgent(stream)
            try:
                await _listed(client, server)
            finally:
                await agent.stop()


async def _listed(client: AsyncClient, server: str) -> None:
    first = await client.submit(job_spec("again", ["true"], workerSets=[]))
    await eventually(lambda: _stage(client, first.metadata.id, "Running"), what="first runs")
    await client.stop(first.metadata.id)
    await eventually(lambda: _stage(client, first.metadata.id, "Succeeded"), what="stopped")
    rc, out, _ = await arranger("list", server=server)
    assert rc == 0 and out == "no unfinished jobs (--all lists finished ones)\n"

    gpu_job = job_spec("again", ["true"], workerSets=[])
    gpu_job["spec"]["leader"]["template"]["resources"]["gpu"] = 1
    second = await client.submit(gpu_job)
    await eventually(lambda: _stage(client, second.metadata.id, "Running"), what="second runs")
    rc, out, err = await arranger("list", server=server)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["NAME", "ID", "OWNER"]
    assert [line.split()[:2] for line in lines[1:]] == [["again", second.metadata.id]]
    rc, out, err = await arranger("list", "--all", server=server)
    assert [line.split()[:2] for line in out.splitlines()[1:]] == [
        ["again", first.metadata.id],
        ["again", second.metadata.id],
    ], err
    rc, out, err = await arranger("list", "--stage", "succeeded", "-o", "json", server=server)
    assert rc == 0 and [j["id"] for j in json.loads(out)] == [first.metadata.id], err
    # The server takes a stage in any case too (the SDK sends it as given).
    assert [j.id for j in await client.jobs(stages=["RUNNING"])] == [second.metadata.id]
    rc, _, err = await arranger("list", "--stage", "done", server=server)
    assert rc == 2 and "unknown stage 'done': one of Pending, Starting, Running" in err
    rc, out, _ = await arranger("list", "--help")
    assert rc == 0 and "Rescheduling, Succeeded, Failed" in " ".join(out.split())
    rc, out, _ = await arranger("list", "--stage", "Pending", server=server)
    assert out == "no jobs\n"

    # GPU 0 is an index, not "none": in a job's pods and in a node's GPUs.
    rc, out, err = await arranger("get", second.metadata.id, "-o", "json", server=server)
    assert json.loads(out)["status"]["leader"]["gpus"] == [{"index": 0, "share": 1.0}], err
    rc, out, err = await arranger("nodes", "-o", "yaml", server=server)
    assert [g["index"] for g in yaml.safe_load(out)[0]["gpus"]] == [0], err


async def test_submit_warns_of_a_local_file_nothing_ships(tmp_path: Path) -> None:
    here = tmp_path / "project"
    here.mkdir()
    (here / "train.py").write_text("print('trained')\n")
    spec = job_spec("local", ["python3", "train.py"], workerSets=[])
    (here / "job.yaml").write_text(yaml.safe_dump(spec))
    spec["metadata"]["name"] = "shipped"
    (here / "shipped.yaml").write_text(yaml.safe_dump(spec))
    async with running_cluster(tmp_path / "cluster", agents=1) as cluster:
        rc, out, err = await _submit_in(here, cluster.address, "job.yaml")
        assert rc == 0 and "job local submitted" in out, err
        assert err == (
            "warning: spec.leader.template.command names train.py, which is in this "
            "directory but no workingDir ships it; add `workingDir: .`\n"
        )
        rc, out, err = await _submit_in(here, cluster.address, "shipped.yaml", "--working-dir", ".")
        assert rc == 0 and "warning" not in err, err


async def _submit_in(cwd: Path, server: str, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "arranger.client.cli",
        "--server",
        server,
        "submit",
        *args,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _stage(client: AsyncClient, job: str, stage: str) -> bool:
    return (await client.get(job)).status.stage == stage
