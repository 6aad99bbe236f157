"""Experiments through the `arranger` command, a real process against a real cluster: `run
--sweep` and `submit` of a file's sweep, `list` folding an experiment into one line (`--expand`,
`--experiment`), `get` of an experiment (table, sorted CSV, JSON), `explain` of its first
pending member, `stop`, `history --experiment`, `delete`, and `submit --wait` exiting by the
members' outcomes."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from pathlib import Path

import pytest
import yaml

from arranger.client.channel import ArrangerError
from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from tests.client.test_cli import arranger
from tests.conftest import Gate, eventually, job_spec, script

pytestmark = pytest.mark.e2e  # a real server, agents and processes

SMALL = ("--cpu", "0.1", "--memory", "64Mi")


async def _stages(client: AsyncClient, name: str) -> dict[str, int]:
    return dict((await client.get_experiment(name)).summary.stages)


async def test_an_experiment_from_run_through_list_get_explain_stop_history_delete(
    cluster: DevCluster, client: AsyncClient, tmp_path: Path, gate: Gate
) -> None:
    server = cluster.address
    held = gate.command(tmp_path)
    await client.submit(job_spec("solo", held, workerSets=[]))
    rc, out, err = await arranger(
        "run", "--name", "sw", *SMALL, "--sweep", "lr=1e-4,3e-4,1e-3", "--seeds", "2",
        "--max-parallel", "4", "--", *held, "--lr", "{lr}", "--seed", "{seed}",
        server=server,
    )  # fmt: skip
    assert rc == 0, err
    assert out.strip() == "experiment sw submitted: 6 members (3 points x 2 seeds), maxParallel 4"
    sw = await client.get_experiment("sw")
    assert [(m.index, m.values["lr"], m.values["seed"]) for m in sw.members][:3] == [
        (0, "1e-4", "0"),
        (1, "1e-4", "1"),
        (2, "3e-4", "0"),
    ]
    assert list((await client.get("sw-2")).spec.leader.template.command)[-4:] == [
        "--lr", "3e-4", "--seed", "0",
    ]  # fmt: skip

    async def four_running() -> bool:
        return await _stages(client, "sw") == {"Running": 4, "Pending": 2}

    await eventually(four_running, what="4 members running, 2 held")
    for index, loss in ((0, 0.3), (1, 0.1), (2, 0.2)):
        await client.report_values(f"sw-{index}", [(10 * index, {"loss": loss})])
    reports = await client.get_reports("sw", ["loss"])
    assert sorted((r.job, [(s.key, list(s.values)) for s in r.series]) for r in reports) == [
        ("sw-0", [("loss", [0.3])]),
        ("sw-1", [("loss", [0.1])]),
        ("sw-2", [("loss", [0.2])]),
    ]
    assert [j.name for j in await client.jobs(fold=True)] == ["solo"]
    assert len(await client.jobs(experiment="sw")) == 6

    # list: one line for the experiment among the jobs; --expand and --experiment its members.
    rc, out, err = await arranger("list", server=server)
    assert rc == 0, err
    rows = [line.split() for line in out.splitlines()[1:]]
    assert [row[0] for row in rows] == ["solo", "sw"], out
    assert out.splitlines()[2].endswith("experiment of 6: 4 Running, 2 Pending")
    rc, out, err = await arranger("list", "--expand", server=server)
    assert [line.split()[0] for line in out.splitlines()[1:]] == [
        "solo", *(f"sw-{i}" for i in range(6)),
    ], err  # fmt: skip
    rc, out, err = await arranger("list", "--experiment", "sw", server=server)
    assert [line.split()[0] for line in out.splitlines()[1:]] == [f"sw-{i}" for i in range(6)]

    # get: a header, a table of the members; sorted CSV; JSON rows.
    rc, out, err = await arranger("get", "sw", server=server)
    assert rc == 0, err
    assert "6 (3 points x 2 seeds)" in out and "4 Running, 2 Pending" in out
    header = next(line for line in out.splitlines() if line.lstrip().startswith("INDEX"))
    assert header.split() == [
        "INDEX", "NAME", "lr", "SEED", "STAGE", "OUTCOME", "ELAPSED", "EXIT_CODE", "STEP", "loss",
    ]  # fmt: skip
    rc, out, err = await arranger("get", "sw", "--sort", "loss", "-o", "csv", server=server)
    assert rc == 0, err
    table = list(csv.DictReader(io.StringIO(out)))
    assert [r["name"] for r in table] == ["sw-1", "sw-2", "sw-0", "sw-3", "sw-4", "sw-5"]
    assert [r["loss"] for r in table[:4]] == ["0.1", "0.2", "0.3", ""]
    rc, out, err = await arranger("get", "sw", "--sort=-lr", "-o", "json", server=server)
    doc = json.loads(out)
    assert doc["members"] == 6 and doc["maxParallel"] == 4 and doc["parameters"] == ["lr"]
    assert [(r["lr"], r["seed"]) for r in doc["rows"]][:2] == [("1e-3", 0), ("1e-3", 1)], err
    rc, _, err = await arranger("get", "sw", "--sort", "nope", server=server)
    assert rc == 1 and err.startswith("error: --sort 'nope': no such column"), err
    rc, _, err = await arranger("get", "solo", "-o", "csv", server=server)
    assert rc == 1 and err.strip() == "error: -o csv: only for an experiment", err

    # explain: the counts, then the first pending member by index.
    rc, out, err = await arranger("explain", "sw", server=server)
    assert rc == 0, err
    assert out.splitlines()[0] == "experiment sw: 6 members: 4 Running, 2 Pending"
    assert "its first pending member, sw-4 (index 4):" in out

    # stop: every member ends; history lists them (not solo); delete removes the experiment.
    rc, out, err = await arranger("stop", "sw", server=server)
    assert rc == 0 and out == "experiment sw: stopping 6 members (of 6)\n", (out, err)
    gate.open()

    async def all_ended() -> bool:
        summary = (await client.get_experiment("sw")).summary
        return sum(summary.stages.get(s, 0) for s in ("Succeeded", "Failed")) == 6

    await eventually(all_ended, what="every member to end")
    rc, out, err = await arranger("explain", "sw", server=server)
    assert rc == 0 and "no member is pending" in out, err
    rc, out, err = await arranger("history", "--experiment", "sw", "-o", "json", server=server)
    assert rc == 0, err
    names = {r["name"] for r in json.loads(out)}
    assert names and names <= {f"sw-{i}" for i in range(6)}, names
    rc, out, err = await arranger("delete", "sw", server=server)
    assert rc == 0 and out.strip() == "experiment sw deleted with its 6 members", (out, err)
    rc, out, err = await arranger("get", "sw", server=server)
    assert rc == 1 and err.strip() == "error: job 'sw' not found", err
    rc, out, err = await arranger("list", "--all", server=server)  # solo ended with the gate
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["solo"], (out, err)


async def test_submit_wait_exits_by_the_members_outcomes(
    cluster: DevCluster, client: AsyncClient, tmp_path: Path, gate: Gate
) -> None:
    server = cluster.address
    exits = script(tmp_path, "exits", "import sys\nraise SystemExit(int(sys.argv[1]))\n")
    spec = job_spec("codes", [*exits, "{code}"], workerSets=[], restartLimit=0)
    spec["spec"]["sweep"] = {"parameters": {"code": [0]}, "seeds": 2}
    job_file = tmp_path / "sweep.yaml"
    job_file.write_text(yaml.safe_dump(spec))
    rc, out, err = await arranger("submit", str(job_file), "--wait", server=server)
    assert rc == 0, (out, err)
    assert out.splitlines() == [
        "experiment codes submitted: 2 members (1 point x 2 seeds)",
        "experiment codes ended: 2 Completed",
    ]
    rc, out, err = await arranger(
        "submit", str(job_file), "--wait", "--set", "metadata.name=failing",
        "--set", "spec.sweep.parameters.code=[0, 3]", "--set", "spec.sweep.seeds=1",
        server=server,
    )  # fmt: skip
    assert rc == 1, (out, err)
    assert out.splitlines()[-1] == "experiment failing ended: 1 Completed, 1 Failed"
    failing = await client.get_experiment("failing")
    assert sorted(m.exit_code for m in failing.members) == [0, 3]

    # Stopped while waited on: 3.
    waiting = asyncio.create_task(
        arranger(
            "submit",
            str(job_file),
            "--wait",
            "--set",
            "metadata.name=stopped",
            "--set",
            f"spec.leader.template.command={gate.command(tmp_path)}",
            server=server,
        )
    )

    async def running() -> bool:
        try:
            return await _stages(client, "stopped") == {"Running": 2}
        except ArrangerError:  # not submitted yet
            return False

    await eventually(running, what="both members to run")
    await client.stop_experiment("stopped")
    gate.open()
    rc, out, err = await waiting
    assert rc == 3 and out.splitlines()[-1] == "experiment stopped ended: 2 Stopped", (out, err)
