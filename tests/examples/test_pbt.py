"""Tests of the population-based training example: its rules of exploit and explore, its
trainer's checkpoints, and four members of a sweep on a real cluster (a server, two agents,
real processes) exploiting one another through reported values and published checkpoints."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from arranger.agent.discovery import Capacity
from arranger.client.sdk import AsyncClient
from arranger.client.specfile import load_job_data
from arranger.examples.cartpole import checkpoint
from arranger.examples.pbt.member import MemberConfig, Trainer
from arranger.examples.pbt.population import (
    FACTORS,
    MAX_LR,
    MIN_LR,
    Standing,
    caught_up,
    exploit_target,
    explored,
    standing_of,
)
from arranger.job import Peer
from arranger.v1 import arranger_pb2, arranger_pb2_grpc, job_pb2
from tests.conftest import GI, eventually, running_cluster

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGED = REPO_ROOT / "arranger" / "examples" / "pbt" / "job.yaml"


def at(index: int, mean_return: float, step: int = 10) -> Standing:
    return Standing(index, step, mean_return, lr=0.01 * (index + 1), checkpoint=f"/c/{index}")


# --- exploit and explore -----------------------------------------------------------------


def test_the_bottom_quarter_copies_the_best() -> None:
    four = [at(0, 20.0), at(1, 90.0), at(2, 50.0), at(3, 40.0)]
    assert exploit_target(four[0], four) == four[1]  # the worst of four copies the best
    for me in four[1:]:  # the other three are not in the bottom quarter
        assert exploit_target(me, four) is None
    eight = [at(i, 10.0 * i) for i in range(8)]  # members 0 and 1 are the bottom quarter
    assert [exploit_target(me, eight) for me in eight[:3]] == [eight[7], eight[7], None]


def test_two_members_are_enough_and_one_is_not() -> None:
    me, peer = at(0, 20.0), at(1, 30.0)
    assert exploit_target(me, [peer]) == peer
    assert exploit_target(peer, [me]) is None
    assert exploit_target(me, []) is None


def test_peers_behind_and_ties_are_passed_over() -> None:
    me = at(0, 20.0, step=10)
    behind = at(1, 90.0, step=5)  # not at this round yet: not compared
    assert exploit_target(me, [behind]) is None
    assert exploit_target(me, [behind, at(2, 30.0, step=15)]) == at(2, 30.0, step=15)
    # A tie ranks the lower index higher, and a best no better than me is not copied.
    assert exploit_target(at(1, 20.0), [at(0, 20.0)]) is None
    assert exploit_target(at(0, 20.0), [at(1, 20.0)]) is None


def test_explore_moves_the_rate_by_a_factor_within_bounds() -> None:
    rng = np.random.default_rng(0)
    seen = {round(explored(0.01, rng) / 0.01, 6) for _ in range(50)}
    assert seen == set(FACTORS)
    assert explored(MAX_LR, np.random.default_rng(1)) <= MAX_LR
    assert all(explored(MIN_LR, np.random.default_rng(s)) >= MIN_LR for s in range(5))


def test_a_peers_standing_and_whether_all_caught_up() -> None:
    blank = Peer("p-1", "id1", 1, {"lr": "0.01"}, "Running")
    assert standing_of(blank) is None
    full = Peer(
        "p-2", "id2", 2, {}, "Running", step=10,
        latest={"mean_return": 42.0, "lr": 0.02}, notes={"checkpoint": "/c/2"},
    )  # fmt: skip
    assert standing_of(full) == Standing(2, 10, 42.0, 0.02, "/c/2")
    ended = Peer("p-3", "id3", 3, {}, "Succeeded", step=5)
    assert caught_up([full, ended], 10) and not caught_up([full, blank], 10)


def test_a_trainer_takes_a_peers_checkpoint_and_keeps_its_own_step(tmp_path: Path) -> None:
    strong = Trainer(MemberConfig(lr=0.03, index=1, hidden=8, episodes_per_update=2))
    strong.train(3)
    path = strong.save(tmp_path / "strong")
    weak = Trainer(MemberConfig(lr=1e-4, index=0, hidden=8, episodes_per_update=2))
    weak.train(1)
    state = checkpoint.load(path.parent, hidden=8)
    assert state is not None and state.version == 3
    weak.take(state, lr=0.024)
    assert weak.lr == 0.024 and weak.updates == 1
    assert weak.mean_return() == strong.mean_return()
    for name, value in strong.pg.weights.items():
        assert np.array_equal(weak.pg.weights[name], value)
        assert np.array_equal(weak.pg.m[name], strong.pg.m[name])
    weak.train(1)  # it learns on from the copy
    assert weak.updates == 2


def test_packaged_job_spec_matches_the_examples_copy() -> None:
    spec = yaml.safe_load(PACKAGED.read_text())
    assert yaml.safe_load((REPO_ROOT / "examples" / "pbt.yaml").read_text()) == spec
    assert len(spec["spec"]["sweep"]["parameters"]["lr"]) == 4


# --- a population on a real cluster ------------------------------------------------------


def population(checkpoints: Path) -> job_pb2.TYJob:
    """population: the packaged sweep, its checkpoints in `checkpoints`, its members running
    this checkout's code with this Python (the agents pass on no PYTHONPATH of their own)."""
    doc: dict[str, Any] = yaml.safe_load(PACKAGED.read_text())
    doc["spec"]["volumes"][0]["hostPath"] = str(checkpoints)
    template = doc["spec"]["leader"]["template"]
    template["command"][0] = sys.executable
    template["env"] = {"PYTHONPATH": str(REPO_ROOT)}
    return load_job_data(doc)


async def ended(stub: arranger_pb2_grpc.ArrangerStub) -> job_pb2.Experiment | None:
    exp = await stub.GetExperiment(arranger_pb2.GetExperimentRequest(name="pbt"))
    done = sum(exp.summary.stages[s] for s in ("Succeeded", "Failed"))
    return exp if done == exp.summary.members else None


def assert_population(
    exp: job_pb2.Experiment,
    reports: arranger_pb2.GetReportsResponse,
    logs: dict[str, str],
    checkpoints: Path,
) -> None:
    """assert_population: what every member reported and published, and the exploits."""
    by_job = {r.job: {s.key: s for s in r.series} for r in reports.jobs}
    notes = {r.job: dict(r.notes) for r in reports.jobs}
    assert sorted(by_job) == [f"pbt-{i}" for i in range(4)]
    for name, series in by_job.items():
        assert list(series["mean_return"].steps) == [5, 10, 15, 20, 25, 30], name
        assert len(series["lr"].steps) == 6, name
        assert Path(notes[name]["checkpoint"]).is_file(), name
        assert notes[name]["checkpoint"].startswith(str(checkpoints)), name
        assert "Traceback" not in logs[name], logs[name]
    exploits = {name: s["exploited_from"] for name, s in by_job.items() if "exploited_from" in s}
    assert exploits, logs
    for name, series in exploits.items():
        assert all(value != int(name.rsplit("-", 1)[1]) for value in series.values), name
        assert "exploit member" in logs[name], logs[name]
    # Member 0 cannot learn at its own rate: it is the worst of the first round, and copies.
    assert "pbt-0" in exploits, logs
    latest = {m.job.name: dict(m.latest) for m in exp.members}
    assert latest["pbt-0"]["lr"] > 0.0001, latest


@pytest.mark.e2e
async def test_a_population_exploits_its_best_member_through_arranger(tmp_path: Path) -> None:
    """Four members, a quarter of a core each, on two nodes of one core: every member
    completes its six rounds, reports its mean return and learning rate each round and
    publishes its checkpoint; the worst of each round (member 0 starts with a learning rate
    too small to learn) copies the best and reports it."""
    checkpoints = tmp_path / "ckpt"
    checkpoints.mkdir()
    small = Capacity(cpu_milli=1000, memory_bytes=2 * GI)
    started = time.monotonic()
    async with (
        running_cluster(tmp_path / "cluster", capacity=small) as cluster,
        AsyncClient(cluster.address, timeout_s=10) as client,
    ):
        stub = client._stubs[0]
        reply = await stub.SubmitJob(arranger_pb2.SubmitJobRequest(job=population(checkpoints)))
        assert reply.experiment.members == 4
        exp = await eventually(lambda: ended(stub), timeout_s=90, what="every member to end")
        logs = {
            m.job.name: b"".join([c async for c in client.logs(m.job.name)]).decode()
            for m in exp.members
        }
        assert exp.summary.outcomes["Completed"] == 4, logs
        reports = await stub.GetReports(arranger_pb2.GetReportsRequest(name="pbt"))
    took = time.monotonic() - started

    assert_population(exp, reports, logs, checkpoints)
    assert took < 60, took
