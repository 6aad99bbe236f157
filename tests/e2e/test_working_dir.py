"""A job ships its working directory: `python train.py` runs from a copy of it on each node.

Real server and agents on 127.0.0.1, real processes; the second part runs two real
`arranger-server` processes on a shared PostgreSQL store (tests/postgres.py) and kills the
one that took the upload.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from arranger.agent.agent import Agent
from arranger.client import cli
from arranger.client.dev import DevCluster
from arranger.client.sdk import ArrangerError, AsyncClient
from arranger.v1 import arranger_pb2, job_pb2
from tests.conftest import eventually, job_spec
from tests.containers import IMAGE, busybox_image
from tests.postgres import PostgresServer
from tests.server_process import ServerProcess, start_agents

TRAIN = """
import json, os, pathlib, sys, time
import helpers
out = pathlib.Path(os.environ["OUT"])
(out / "leader.json").write_text(json.dumps(helpers.report()))
deadline = time.time() + 60
while not list(out.glob("worker-*.json")):  # the worker ran too, on the other node
    if time.time() > deadline:
        sys.exit(3)
    time.sleep(0.05)
"""
WORKER = """
import json, os, pathlib
import helpers
out = pathlib.Path(os.environ["OUT"])
part = out / ".worker"
part.write_text(json.dumps(helpers.report()))
part.rename(out / "worker-0.json")
"""
HELPERS = """
import os
def report():
    return {"cwd": os.getcwd(), "node": os.environ["ARRANGER_NODE_NAME"],
            "scratch": os.environ["ARRANGER_SCRATCH_DIR"], "files": sorted(os.listdir("."))}
"""


def project(top: Path) -> Path:
    """project: a directory as a user has it on their laptop, ignore files and all."""
    files = {
        "train.py": TRAIN,
        "worker.py": WORKER,
        "helpers.py": HELPERS,
        ".gitignore": "*.log\ncheckpoints/\n",
        ".arrangerignore": "secret.txt\n",
        "run.log": "x",
        "checkpoints/big.pt": "x",
        "secret.txt": "x",
        ".git/HEAD": "x",
    }
    for rel, text in files.items():
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_text(text)
    return top


def spec(name: str, out: Path, **extra: Any) -> dict[str, Any]:
    """spec: leader and worker each take 3 of a node's 4 cores: they run on different nodes."""
    job = job_spec(name, [sys.executable, "train.py"], [sys.executable, "worker.py"], cpu=3)
    for template in (job["spec"]["leader"]["template"], job["spec"]["workerSets"][0]["template"]):
        template["env"] = {"OUT": str(out)}
    job["spec"].update(restartLimit=0, **extra)
    return job


def check_ran_from_copies(out: Path) -> None:
    leader = json.loads((out / "leader.json").read_text())
    worker = json.loads((out / "worker-0.json").read_text())
    assert leader["node"] != worker["node"]
    for report in (leader, worker):
        assert report["cwd"] == str(Path(report["scratch"]) / "work")
        shipped = [name for name in report["files"] if name != "__pycache__"]
        assert shipped == [".arrangerignore", ".gitignore", "helpers.py", "train.py", "worker.py"]


async def submit_with_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """submit_with_cli runs `arranger ...` (its client has a loop of its own: in a thread)."""
    capsys.readouterr()
    code = await asyncio.to_thread(cli.main, list(argv))
    return code, capsys.readouterr().out


async def test_a_job_runs_from_its_shipped_directory_and_a_second_submit_uploads_nothing(
    cluster: DevCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = project(tmp_path / "proj")
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    first_out, second_out = tmp_path / "out1", tmp_path / "out2"
    first_out.mkdir()
    second_out.mkdir()
    job_file = jobs / "job.yaml"  # spec.workingDir is relative to the YAML file
    job_file.write_text(yaml.safe_dump(spec("shipped", first_out, workingDir="../proj")))
    code, said = await submit_with_cli(capsys, "--server", cluster.address, "submit", str(job_file))
    assert code == 0, said
    assert "working dir: 5 files" in said and ": uploaded" in said, said
    async with AsyncClient(cluster.address, timeout_s=10) as client:
        done = await client.wait("shipped", timeout_s=60)
        assert done.status.stage == "Succeeded", done.status
        assert len(done.spec.package.sha256) == 64 and not done.spec.working_dir
        check_ran_from_copies(first_out)

        # The same tree again, from the flag (it overrides the YAML's): nothing is uploaded,
        # and no agent fetches it again.
        job_file.write_text(yaml.safe_dump(spec("again", second_out, workingDir="elsewhere")))
        code, said = await submit_with_cli(
            capsys,
            "--server",
            cluster.address,
            "submit",
            str(job_file),
            "--working-dir",
            str(source),
        )
        assert code == 0, said
        assert "already on the server, not uploaded" in said, said
        again = await client.wait("again", timeout_s=60)
        assert again.status.stage == "Succeeded", again.status
        assert again.spec.package == done.spec.package
        check_ran_from_copies(second_out)
    fetched = [agent.supervisor.packages.fetched for agent in cluster.agents]
    assert fetched == [1, 1]


async def test_uploads_that_do_not_match_are_refused_and_jobs_need_their_package(
    cluster: DevCluster, tmp_path: Path
) -> None:
    data = b"not what was announced"
    claimed = job_pb2.Package(sha256=hashlib.sha256(b"other").hexdigest(), size=len(data))

    async def messages(package: job_pb2.Package, chunk: bytes) -> Any:
        yield arranger_pb2.UploadPackageRequest(package=package, data=chunk)

    async with AsyncClient(cluster.address, timeout_s=10) as client:
        with pytest.raises(ArrangerError) as refused:
            await client.upload_package(lambda: messages(claimed, data))
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "not the 22 bytes with sha256" in refused.value.message
        assert "nothing was stored" in refused.value.message
        assert not (await client.has_package(claimed.sha256)).present

        huge = job_pb2.Package(sha256=claimed.sha256, size=2**40)
        with pytest.raises(ArrangerError) as refused:
            await client.upload_package(lambda: messages(huge, data))
        assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused.value.message.startswith("limits.packageBytes: ")

        job = spec("orphan", tmp_path)
        job["spec"]["package"] = {"sha256": claimed.sha256, "size": len(data)}
        with pytest.raises(ArrangerError) as refused:
            await client.submit(job)
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.message.startswith("spec.package: the server does not hold")


def found(top: Path, name: str) -> list[Path]:
    return list(top.glob(f"**/{name}"))


def hostile_archive() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escaped.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    return out.getvalue()


async def test_a_hostile_archive_fails_the_job_with_the_reason(
    cluster: DevCluster, tmp_path: Path
) -> None:
    data = hostile_archive()
    package = job_pb2.Package(sha256=hashlib.sha256(data).hexdigest(), size=len(data))

    async def messages() -> Any:
        yield arranger_pb2.UploadPackageRequest(package=package, data=data)

    async with AsyncClient(cluster.address, timeout_s=10) as client:
        assert (await client.upload_package(messages)).stored
        job = spec("hostile", tmp_path)
        job["spec"]["restartLimit"] = 3
        job["spec"]["package"] = {"sha256": package.sha256, "size": package.size}
        await client.submit(job)
        done = await client.wait("hostile", timeout_s=60)
    assert done.status.stage == "Failed"
    assert done.status.reason == "PackageRefused", done.status  # at once: no restart helps
    assert "'../escaped.py': a path with '..'" in done.status.message
    assert done.status.leader_restarts == 0
    assert not found(cluster.data_dir, "escaped.py")


async def test_a_container_starts_in_its_copy_of_the_working_directory(
    cluster: DevCluster, tmp_path: Path
) -> None:
    busybox_image()
    source = project(tmp_path / "proj")
    (source / "run.sh").write_text("pwd > /out/pwd; cat data.txt > /out/data\n")
    (source / "data.txt").write_text("shipped\n")
    out = tmp_path / "out"
    out.mkdir()
    job = spec("boxed", out, volumes=[{"name": "out", "hostPath": str(out), "mountPath": "/out"}])
    leader = job["spec"]["leader"]["template"]
    leader.update(image=IMAGE, command=["sh", "run.sh"], env={})
    worker = job["spec"]["workerSets"][0]["template"]
    worker["command"] = [sys.executable, "-c", "pass"]
    async with AsyncClient(cluster.address, timeout_s=10) as client:
        await client.submit(job, source)
        done = await client.wait("boxed", timeout_s=90)
    assert done.status.stage == "Succeeded", done.status
    assert (out / "pwd").read_text() == "/arranger/scratch/work\n"
    assert (out / "data").read_text() == "shipped\n"


@pytest.mark.timeout(240)
async def test_a_package_uploaded_to_a_server_that_dies_runs_from_the_next(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    url = postgres.new_database()
    shared = {"leaseSeconds": 2, "fenceTimeoutSeconds": 40, "nodeTimeoutSeconds": 60}
    a = ServerProcess(tmp_path / "a", store=url, **shared)
    b = ServerProcess(tmp_path / "b", init=False, store=url, **shared)
    agents: list[Agent] = []
    source = project(tmp_path / "proj")
    out = tmp_path / "out"
    out.mkdir()
    try:
        await a.start()
        b.launch()
        async with AsyncClient(a.address, timeout_s=10) as on_a:
            shipped = await cli_free_ship(on_a, source)
        assert shipped.uploaded
        a.kill()
        await eventually(b.serving, timeout_s=30, what="the standby to take over")
        agents += start_agents(tmp_path, f"{a.address},{b.address}", 2)
        await eventually(lambda: all(x.connected.is_set() for x in agents), what="agents")
        async with AsyncClient(f"{a.address},{b.address}", timeout_s=20) as client:
            said: list[bool] = []
            await client.submit(spec("after", out), source, lambda s: said.append(s.uploaded))
            assert said == [False]  # the new active server holds what the dead one stored
            done = await client.wait("after", timeout_s=60)
        assert done.status.stage == "Succeeded", done.status
        check_ran_from_copies(out)
    finally:
        await asyncio.gather(*(x.stop() for x in agents), return_exceptions=True)
        a.kill()
        b.kill()


async def cli_free_ship(client: AsyncClient, source: Path) -> Any:
    from arranger.client.package import ship  # noqa: PLC0415

    return await ship(client, source)
