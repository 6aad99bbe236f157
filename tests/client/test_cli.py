"""The `arranger` command as a user runs it: a real process against a real cluster."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from tests.conftest import eventually, job_spec, script


async def arranger(*args: str, server: str = "") -> tuple[int, str, str]:
    argv = [
        sys.executable,
        "-m",
        "arranger.client.cli",
        *(["--server", server] if server else []),
        *args,
    ]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.e2e
async def test_submit_list_get_logs_stop_delete(cluster: DevCluster, tmp_path: Path) -> None:
    server = cluster.address
    leader = script(
        tmp_path,
        "hello",
        "import signal\nprint('hello from the learner', flush=True)\nsignal.pause()\n",
    )
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job_spec("cli-job", leader=leader, workers=2)))

    rc, out, err = await arranger("submit", str(job_file), server=server)
    assert rc == 0 and "job cli-job submitted" in out, err
    rc, out, err = await arranger("list", server=server)
    assert rc == 0 and "cli-job" in out and "default" in out
    rc, out, err = await arranger("get", "cli-job", "-o", "json", server=server)
    job = json.loads(out)
    assert job["metadata"]["name"] == "cli-job" and job["spec"]["priority"] == 5
    assert job["spec"]["leader"]["template"]["resources"]["memory"] == str(64 * 2**20)

    async with AsyncClient(server) as client:

        async def printed() -> bool:
            return b"hello" in b"".join([c async for c in client.logs("cli-job")])

        await eventually(printed, what="the learner's first line")
    rc, out, err = await arranger("logs", "cli-job", server=server)
    assert out == "hello from the learner\n"
    rc, out, _ = await arranger("get", "cli-job", server=server)
    assert rc == 0 and "cli-job-actors-1" in out and "Running" in out
    rc, out, _ = await arranger("nodes", "-o", "yaml", server=server)
    nodes = yaml.safe_load(out)
    assert [n["name"] for n in nodes] == ["dev-0", "dev-1"]
    watcher = asyncio.create_task(arranger("watch", "cli-job", server=server))
    rc, out, _ = await arranger("stop", "cli-job", server=server)
    assert rc == 0 and "stopping" in out
    rc, out, _ = await watcher
    assert rc == 0 and "Succeeded" in out.splitlines()[-1]
    rc, out, _ = await arranger("events", "cli-job", server=server)
    assert "StopRequested" in out and "Submitted" in out
    rc, out, _ = await arranger("delete", "cli-job", server=server)
    assert rc == 0
    rc, out, err = await arranger("get", "cli-job", server=server)
    assert rc == 1 and err.strip() == "error: job 'cli-job' not found"


@pytest.mark.e2e
async def test_user_mistakes_are_one_clear_line(cluster: DevCluster, tmp_path: Path) -> None:
    server = cluster.address
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("metadata: {name: x\nspec:\n")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("metadata: {name: x}\nspec:\n  leader: {name: l, template: {comand: [a]}}\n")
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text(yaml.safe_dump(job_spec("x", leader=["true"], priority=42)))
    cases = [
        (["submit", str(bad_yaml)], f"error: {bad_yaml}: invalid YAML at line 2"),
        (
            ["submit", str(unknown)],
            f"error: {unknown}: spec.leader.template.comand: unknown field (did you mean 'command'?)",
        ),
        (["submit", str(invalid)], "error: spec.priority: must be between 1 and 10"),
        (["submit", str(tmp_path / "missing.yaml")], "error: "),
        (["logs", "nope"], "error: job 'nope' not found"),
    ]
    for args, expected in cases:
        rc, out, err = await arranger(*args, server=server)
        assert rc == 1, (args, out, err)
        assert err.startswith(expected), (args, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


async def test_an_unreachable_server_is_one_line() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    rc, _, err = await arranger("list", server=f"127.0.0.1:{port}")
    assert rc == 1
    assert err.strip() == (
        f"error: cannot reach arranger-server at 127.0.0.1:{port} (is it running? set --server or ARRANGER_SERVER)"
    )


async def test_help_lists_every_command() -> None:
    rc, out, _ = await arranger("--help")
    assert rc == 0
    for command in (
        "dev",
        "server",
        "agent",
        "submit",
        "list",
        "get",
        "watch",
        "logs",
        "stop",
        "delete",
        "nodes",
    ):
        assert command in out


@pytest.mark.e2e
async def test_queue_and_node_commands(cluster: DevCluster) -> None:
    server = cluster.address
    rc, out, err = await arranger(
        "queue",
        "create",
        "team",
        "--weight",
        "3",
        "--cpu",
        "8",
        "--memory",
        "16Gi",
        "--min-run-seconds",
        "600",
        server=server,
    )
    assert rc == 0 and out.strip() == "queue team created", err
    rc, out, err = await arranger(
        "queue", "update", "team", "--gpu", "2", "--machine-group", "lab", server=server
    )
    assert rc == 0, err
    rc, out, _ = await arranger("queues", "-o", "json", server=server)
    team = next(q for q in json.loads(out) if q["name"] == "team")
    assert team["weight"] == 3 and team["capability"] == {
        "cpu": 8,
        "memory": str(16 * 2**30),
        "gpu": 2,
    }
    assert team["machineGroups"] == ["lab"]
    assert team["minRunSeconds"] == 600  # an update that does not name it keeps it
    rc, out, _ = await arranger("queues", server=server)
    assert "team" in out and "cpu 8, mem 16Gi, gpu 2" in out and "min run 600 s" in out
    rc, _, err = await arranger("queue", "update", "team", "--min-run-seconds", "-1", server=server)
    assert rc == 1 and "queue.minRunSeconds: must be 0..604800 seconds" in err
    rc, _, err = await arranger("queue", "delete", "default", server=server)
    assert rc == 1 and err.strip() == "error: the default queue cannot be deleted"
    rc, out, _ = await arranger("queue", "delete", "team", server=server)
    assert rc == 0
    rc, out, _ = await arranger("cordon", "dev-1", server=server)
    assert out.strip() == "node dev-1 cordoned"
    rc, out, _ = await arranger("nodes", server=server)
    assert "Ready,Cordoned" in out
    rc, out, _ = await arranger("uncordon", "dev-1", server=server)
    assert out.strip() == "node dev-1 uncordoned"
    rc, out, _ = await arranger("drain", "dev-0", server=server)
    assert out.strip() == "node dev-0 cordoned; its 0 pods are moving elsewhere"
    rc, _, err = await arranger("drain", "nowhere", server=server)
    assert rc == 1 and err.strip() == "error: node 'nowhere' not found"


@pytest.mark.e2e
async def test_a_reader_that_goes_away_ends_a_command_quietly(
    cluster: DevCluster, tmp_path: Path
) -> None:
    # `arranger logs JOB | head -1`: the reader closes the pipe after a line; the command
    # ends with 141, as a pipeline's commands do, and says nothing.
    many = script(tmp_path, "many", "for i in range(200_000):\n    print(i)\n")
    async with AsyncClient(cluster.address) as client:
        await client.submit(job_spec("talker", leader=many, worker=["true"], workers=1))

        async def ended() -> bool:
            return (await client.get("talker")).status.stage == "Succeeded"

        await eventually(ended, what="the learner to print everything")
    argv = [
        sys.executable,
        "-m",
        "arranger.client.cli",
        "--server",
        cluster.address,
        "logs",
        "talker",
    ]

    def head(argv: list[str], lines: int) -> tuple[bytes, int, bytes]:
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
            assert proc.stdout is not None and proc.stderr is not None
            first = b"".join(proc.stdout.readline() for _ in range(lines))
            proc.stdout.close()
            err = proc.stderr.read()
            return first, proc.wait(timeout=60), err

    first, status, err = await asyncio.to_thread(head, argv, 1)
    assert (first, status, err) == (b"0\n", 141, b"")
    # A table (rich renders it) ends the same way: `arranger nodes | true`, the reader gone
    # before the first byte, so that every table, however short, meets the closed pipe.
    for table in (["nodes"], ["queues"], ["events", "talker"], ["history"], ["explain", "talker"]):
        ended = await asyncio.to_thread(head, [*argv[:-2], *table], 0)
        assert ended == (b"", 141, b""), table
