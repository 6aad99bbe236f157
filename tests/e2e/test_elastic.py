"""Elastic worker sets end to end: a job's sets scaled up and down through the CLI, the SDK and
the in-job SDK (the learner scaling its own actors), on a real server with real agents and
processes on 127.0.0.1.

Every pod writes its ARRANGER_ environment to OUT/<pod>.json when it starts, then waits to be
stopped; the tests read ranks, indices and worker counts from there.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import grpc
import pytest

import arranger
from arranger.client import cli
from arranger.client.dev import DevCluster
from arranger.client.sdk import ArrangerError, AsyncClient
from arranger.v1 import job_pb2
from tests.conftest import Gate, eventually, job_spec, script

LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[")  # how the cluster logs
# The pods import the arranger under test, not whichever one is installed.
SOURCE = str(Path(arranger.__file__).resolve().parents[1])
REPORT = """
import json, os, pathlib, signal
out = pathlib.Path(os.environ["OUT"])
env = {k: v for k, v in os.environ.items() if k.startswith("ARRANGER_")}
part = out / (os.environ["ARRANGER_POD_NAME"] + ".part")
part.write_text(json.dumps(env))
part.rename(out / (os.environ["ARRANGER_POD_NAME"] + ".json"))
"""
IDLE = REPORT + "signal.pause()\n"
LEARNER = (
    REPORT
    + """
import grpc, socket
from arranger.job import current
def hold():  # until the test opens the gate
    socket.create_connection(("127.0.0.1", int(os.environ["GATE"]))).recv(1)
def said(call):
    try:
        call()
    except grpc.RpcError as exc:
        return [exc.code().name, exc.details()]
    return ["OK", ""]
job = current()
job.scale("actors", 3)
hold()
members = [[m.name, m.worker_set, m.index, m.rank, m.state, m.address("rpc")]
           for m in job.members()]
refusals = [said(lambda: job.scale("actors", n)) for n in (5, 0)] + [
    said(lambda: job.scale("nope", 1))
]
job.scale("actors", 1)
after = [[m.name, m.state] for m in job.members()]
report = {"members": members, "refusals": refusals, "after": after}
(out / "learner.part").write_text(json.dumps(report))
(out / "learner.part").rename(out / "learner.report")
signal.pause()
"""
)


def elastic(
    name: str,
    tmp_path: Path,
    out: Path,
    sets: list[dict[str, Any]],
    leader: str = IDLE,
    **spec: Any,
) -> dict[str, Any]:
    """elastic: a job whose leader runs `leader` and whose sets (name, counts, maxCounts,
    minCount) run IDLE with a port named rpc; every pod reports to `out`."""
    body = job_spec(name, script(tmp_path, f"{name}-leader", leader), **spec)
    env = {"OUT": str(out), "PYTHONPATH": SOURCE}
    body["spec"]["leader"]["template"]["env"] = dict(env)
    template = {
        "command": script(tmp_path, "idle", IDLE),
        "resources": {"cpu": 0.1, "memory": "64Mi"},
        "env": env,
        "ports": [{"name": "rpc"}],
    }
    body["spec"]["workerSets"] = [{**s, "template": dict(template)} for s in sets]
    return body


async def reported(out: Path, *pods: str) -> None:
    """reported waits until each of the pods has written its environment."""
    await eventually(lambda: all((out / f"{p}.json").exists() for p in pods), what=str(pods))


def env_of(out: Path, pod: str) -> dict[str, str]:
    """env_of: the ARRANGER_ environment pod `pod` started with."""
    result: dict[str, str] = json.loads((out / f"{pod}.json").read_text())
    return result


def placement(out: Path, pod: str) -> tuple[str, str, str]:
    """placement: (index, rank, number of workers) as pod `pod` was told at launch."""
    env = env_of(out, pod)
    return env["ARRANGER_WORKER_INDEX"], env["ARRANGER_WORKER_RANK"], env["ARRANGER_NUM_WORKERS"]


async def pods(client: AsyncClient, job: str) -> dict[str, job_pb2.PodStatus]:
    """pods: the job's pods by name, scaled-down ones included."""
    status = (await client.get(job)).status
    return {p.name: p for p in [status.leader, *status.workers]}


async def scaled_down(client: AsyncClient, job: str, *names: str) -> dict[str, job_pb2.PodStatus]:
    """scaled_down waits until the pods ended Killed for the scale-down, and returns them all."""

    async def ended() -> dict[str, job_pb2.PodStatus] | None:
        now = await pods(client, job)
        gone = all((now[n].state, now[n].reason) == ("Killed", "ScaledDown") for n in names)
        return now if gone else None

    found: dict[str, job_pb2.PodStatus] = await eventually(ended, what=f"{names} scaled down")
    return found


async def arranger_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """arranger_cli runs `arranger ARGV` (its client has a loop of its own: in a thread) and
    returns its exit status, standard output and standard error; the in-process cluster's log
    lines, written meanwhile, are left out."""
    capsys.readouterr()
    code = await asyncio.to_thread(cli.main, list(argv))
    said = capsys.readouterr()
    return code, "".join(unlogged(said.out)), "".join(unlogged(said.err))


def unlogged(text: str) -> list[str]:
    """unlogged: the lines of `text` that are not the cluster's log lines."""
    return [line for line in text.splitlines(keepends=True) if not LOG_LINE.match(line)]


async def test_the_cli_scales_two_sets_up_and_down_and_refuses_what_the_spec_forbids(
    cluster: DevCluster, client: AsyncClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    sets = [
        {"name": "actors", "counts": 1, "maxCounts": 3, "minCount": 1},
        {"name": "evals", "counts": 1, "maxCounts": 2},
    ]
    await client.submit(elastic("el", tmp_path, out, sets, minWorkersNum=2))
    await reported(out, "el-actors-0", "el-evals-0")
    # A rank leaves room for every earlier set up to its maxCounts.
    assert placement(out, "el-actors-0") == ("0", "0", "2")
    assert placement(out, "el-evals-0") == ("0", "3", "2")

    async def scale(*argv: str) -> tuple[int, str, str]:
        return await arranger_cli(capsys, "--server", cluster.address, "scale", "el", *argv)

    code, said, err = await scale("actors", "3")
    assert code == 0 and not err, err
    assert said == "job el: set actors wants 3 workers (min 1, max 3)\n", said
    await reported(out, "el-actors-1", "el-actors-2")
    assert placement(out, "el-actors-1") == ("1", "1", "4")
    assert placement(out, "el-actors-2") == ("2", "2", "4")
    assert (await scale("evals", "2"))[0] == 0
    await reported(out, "el-evals-1")
    assert placement(out, "el-evals-1") == ("1", "4", "5")

    assert (await scale("evals", "0"))[0] == 0  # its minCount is 0
    await scaled_down(client, "el", "el-evals-0", "el-evals-1")
    for argv, message in [
        (("actors", "1"), "counts: the job would want 1 workers, fewer than its minWorkersNum (2)"),
        (("actors", "4"), "counts: must be at most the set's maxCounts (3)"),
        (("actors", "0"), "counts: must be at least the set's minCount (1)"),
        (("nope", "1"), "workerSet: job 'el' has no set 'nope' (sets: actors, evals)"),
    ]:
        code, said, err = await scale(*argv)
        assert (code, said, err) == (1, "", f"error: {message}\n"), argv

    running = await pods(client, "el")
    assert (await scale("actors", "2"))[0] == 0  # the highest index goes
    now = await scaled_down(client, "el", "el-actors-2")
    for name in ("el-learner", "el-actors-0", "el-actors-1"):
        assert now[name].state == "Running" and now[name].pid == running[name].pid, name
    job = await client.get("el")
    assert job.status.stage == "Running" and job.status.running_workers == 2
    assert dict(job.status.worker_set_restarts) == {} and job.status.leader_restarts == 0
    assert [(ws.name, ws.counts) for ws in job.spec.worker_sets] == [("actors", 2), ("evals", 0)]
    await client.delete("el")


async def test_the_sdk_scales_a_set_to_nothing_and_back_with_its_old_rank(
    client: AsyncClient, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    sets = [{"name": "evals", "counts": 1}, {"name": "actors", "counts": 2, "maxCounts": 4}]
    await client.submit(elastic("sd", tmp_path, out, sets, minWorkersNum=1))
    job = await client.scale("sd", "actors", 4)
    assert [ws.counts for ws in job.spec.worker_sets] == [1, 4]
    await reported(out, *(f"sd-actors-{i}" for i in range(4)))
    assert placement(out, "sd-actors-3") == ("3", "4", "5")

    async def all_running() -> bool:
        return (await client.get("sd")).status.running_workers == 5

    await eventually(all_running, what="every worker running")
    for counts, field in [(5, "counts: must be at most"), (-1, "counts: must be at least")]:
        with pytest.raises(ArrangerError) as refused:
            await client.scale("sd", "actors", counts)
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.message.startswith(field), refused.value.message
    with pytest.raises(ArrangerError) as refused:
        await client.scale("sd", "learners", 1)
    assert refused.value.code == grpc.StatusCode.NOT_FOUND
    assert refused.value.message.startswith("workerSet: "), refused.value.message

    await client.scale("sd", "actors", 0)  # minWorkersNum 1 is the eval's
    now = await scaled_down(client, "sd", *(f"sd-actors-{i}" for i in range(4)))
    assert now["sd-learner"].state == now["sd-evals-0"].state == "Running"
    job = await client.get("sd")
    assert job.status.stage == "Running" and dict(job.status.worker_set_restarts) == {}

    (out / "sd-actors-1.json").unlink()
    await client.scale("sd", "actors", 2)
    await reported(out, "sd-actors-1")
    env = env_of(out, "sd-actors-1")
    assert placement(out, "sd-actors-1") == ("1", "2", "3")
    assert env["ARRANGER_RESTART_COUNT"] == "1"  # its next attempt, counted as no restart
    job = await client.get("sd")
    assert dict(job.status.worker_set_restarts) == {} and job.status.stage == "Running"
    await client.delete("sd")


async def test_a_learner_scales_its_own_actors_and_lists_them_with_their_addresses(
    client: AsyncClient, tmp_path: Path, gate: Gate
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    sets = [{"name": "actors", "counts": 1, "maxCounts": 4, "minCount": 1}]
    spec = elastic("el", tmp_path, out, sets, leader=LEARNER, minWorkersNum=1)
    spec["spec"]["leader"]["template"]["env"]["GATE"] = str(gate.port)
    await client.submit(spec)

    async def all_running() -> bool:
        return (await client.get("el")).status.running_workers == 3

    await eventually(all_running, what="the learner's actors running")
    names = ["el-learner", *(f"el-actors-{i}" for i in range(3))]
    await reported(out, *names)
    env = env_of(out, "el-actors-2")
    assert placement(out, "el-actors-2") == ("2", "2", "3")
    assert env["ARRANGER_JOB_TOKEN"].startswith("arj_") and env["ARRANGER_API"]
    gate.open()
    await eventually((out / "learner.report").exists, what="the learner's report")
    report = json.loads((out / "learner.report").read_text())

    address = {n: f"127.0.0.1:{env_of(out, n)['ARRANGER_PORT_RPC']}" for n in names}
    assert report["members"] == [
        ["el-learner", "", 0, -1, "Running", address["el-learner"]],
        *(
            [f"el-actors-{i}", "actors", i, i, "Running", address[f"el-actors-{i}"]]
            for i in range(3)
        ),
    ]
    assert report["refusals"] == [
        ["INVALID_ARGUMENT", "counts: must be at most the set's maxCounts (4)"],
        ["INVALID_ARGUMENT", "counts: must be at least the set's minCount (1)"],
        ["NOT_FOUND", "workerSet: job 'el' has no set 'nope' (sets: actors)"],
    ]
    # Just after scaling down, members() lists only the workers wanted.
    assert [name for name, _ in report["after"]] == ["el-learner", "el-actors-0"]
    await scaled_down(client, "el", "el-actors-2", "el-actors-1")
    job = await client.get("el")
    assert job.status.stage == "Running" and dict(job.status.worker_set_restarts) == {}
    await client.stop("el")
