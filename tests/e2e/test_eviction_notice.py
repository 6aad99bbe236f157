"""Eviction notices end to end, on the real clock: a low-priority job with
`evictionNoticeSeconds` is told before its pods are stopped for a high-priority job, on a real
server with real agents and processes on 127.0.0.1.

The learner of the low job reads its job's events with the in-job SDK and writes each one,
with the time it came, to OUT/learner.events; every pod writes when it got SIGTERM to
OUT/<pod>.<attempt>.term and exits. Times are compared on the one machine's wall clock, with
room for a loaded 2-core machine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from tests.conftest import Gate, eventually, job_spec, script
from tests.e2e.test_elastic import SOURCE, arranger_cli, pods

LATE_S = 1.5  # how late a message may be read on a loaded machine
EARLY_S = 0.1  # how early one clock may read against another (both wall clocks, one machine)
POD = """
import json, os, pathlib, signal, socket, time
out = pathlib.Path(os.environ["OUT"])
me = os.environ["ARRANGER_POD_NAME"] + "." + os.environ["ARRANGER_RESTART_COUNT"]
def write(path, text):
    (out / (path + ".part")).write_text(text)
    (out / (path + ".part")).rename(out / path)
def stopped(signum, frame):
    write(me + ".term", repr(time.time()))
    os._exit(0)
signal.signal(signal.SIGTERM, stopped)
write(me + ".ready", "")
"""
ACTOR = POD + "while True:\n    signal.pause()\n"
LEARNER = (
    POD
    + """
from arranger.job import current
job = current()
def log(kind, pod="", left=None):
    entry = {"kind": kind, "pod": pod, "left": left, "t": time.time(), "me": me}
    with open(out / "learner.events", "a") as f:
        f.write(json.dumps(entry) + "\\n")
for event in job.events():
    log(event.kind, event.member.name, event.seconds_left)
    if event.kind == "job-evicting" and os.environ.get("GATE"):
        socket.create_connection(("127.0.0.1", int(os.environ["GATE"]))).recv(1)
        log("answering")  # the eviction goes at once: this is the learner's last word
        job.checkpointed()
"""
)


def low_job(
    tmp_path: Path, out: Path, workers: int, cpu: float, notice_s: float, **env: str
) -> dict[str, Any]:
    """low_job: the job given notice, priority 2, with a minimum of one worker."""
    spec = job_spec(
        "low",
        script(tmp_path, "learner", LEARNER),
        script(tmp_path, "actor", ACTOR),
        workers=workers,
        cpu=cpu,
        priority=2,
        minWorkersNum=1,
        preemptionGraceSeconds=5,
        evictionNoticeSeconds=notice_s,
    )
    for template in (spec["spec"]["leader"], spec["spec"]["workerSets"][0]):
        template["template"]["env"] = {"OUT": str(out), "PYTHONPATH": SOURCE, **env}
    return spec


def high_job(tmp_path: Path, out: Path, workers: int, cpu: float) -> dict[str, Any]:
    """high_job: the job the low one is evicted for, priority 8, all its workers needed."""
    spec = job_spec(
        "high",
        script(tmp_path, "actor", ACTOR),
        workers=workers,
        cpu=cpu,
        priority=8,
        minWorkersNum=workers,
    )
    spec["spec"]["leader"]["template"]["env"] = {"OUT": str(out)}
    spec["spec"]["workerSets"][0]["template"]["env"] = {"OUT": str(out)}
    return spec


def logged(out: Path) -> list[dict[str, Any]]:
    """logged: the learner's events so far (whole lines only), in the order they came."""
    path = out / "learner.events"
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def terms(out: Path) -> dict[str, float]:
    """terms: when each pod got SIGTERM, by `<pod>.<attempt>`."""
    return {p.name.removesuffix(".term"): float(p.read_text()) for p in out.glob("*.term")}


def seconds(stamp: Any) -> float:
    return float(stamp.ToNanoseconds()) / 1e9


async def started(cluster: DevCluster, client: AsyncClient, out: Path, pods: int) -> None:
    """started waits until the low job's pods are ready and its learner is watching it."""
    await eventually(lambda: len(list(out.glob("low-*.0.ready"))) == pods, what="low ready")
    job_id = (await client.get("low")).metadata.id
    watching = cluster.server.job_tokens.digest(job_id)
    await eventually(lambda: watching in cluster.server.streams.tokens("job"), what="the learner")


async def test_surplus_actors_are_stopped_for_a_higher_priority_job_only_after_their_notice(
    cluster: DevCluster, client: AsyncClient, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    notice_s = 3.0
    await client.submit(low_job(tmp_path, out, workers=6, cpu=1, notice_s=notice_s))
    await started(cluster, client, out, pods=7)  # 7 of the cluster's 8 cores
    await client.submit(high_job(tmp_path, out, workers=2, cpu=1))  # 2 cores short
    high = await client.wait("high", stages=["Running"], timeout_s=30)

    notices = {e["pod"]: e for e in logged(out) if e["kind"] == "evicting"}
    stopped = {name.removesuffix(".0"): t for name, t in terms(out).items()}
    assert len(notices) == 2 and set(notices) == set(stopped), (notices, stopped)
    assert not [e for e in logged(out) if e["kind"] == "job-evicting"]
    ends = []
    for pod, notice in notices.items():
        end = notice["t"] + notice["left"]  # the pod's evict_at, read on the learner's clock
        assert notice_s - LATE_S <= notice["left"] <= notice_s + EARLY_S, notice
        assert notice["t"] < stopped[pod], (notice, stopped[pod])
        assert end - EARLY_S <= stopped[pod] <= end + LATE_S + 1, (notice, stopped[pod])
        ends.append(end)
    assert seconds(high.status.leader.start_time) >= min(ends) - EARLY_S

    low = await pods(client, "low")
    for pod in stopped:
        assert low[pod].state == "Pending" and not low[pod].HasField("evict_at"), low[pod]
    job = await client.get("low")
    assert job.status.stage == "Running" and dict(job.status.worker_set_restarts) == {}
    said = {e.kind: e.message for e in await client.events("low")}
    assert f"in {notice_s:g} s: preempted by job high" in said["EvictionNotice"], said
    assert all(pod in said["EvictionNotice"] for pod in stopped), said
    assert "evicted: the notice ended" in said["NoticeEnded"], said
    for name in ("high", "low"):
        await client.delete(name)


@pytest.mark.parametrize("answers", [True, False], ids=["checkpointed", "no-answer"])
async def test_a_whole_job_is_told_and_goes_when_its_learner_checkpoints_or_its_notice_ends(
    cluster: DevCluster,
    client: AsyncClient,
    tmp_path: Path,
    gate: Gate,
    capsys: pytest.CaptureFixture[str],
    answers: bool,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    notice_s = 60.0 if answers else 3.0
    env = {"GATE": str(gate.port)} if answers else {}
    # Learner and actor take 3 of each node's 4 cores; the high job needs both nodes.
    await client.submit(low_job(tmp_path, out, workers=1, cpu=3, notice_s=notice_s, **env))
    await started(cluster, client, out, pods=2)
    await client.submit(high_job(tmp_path, out, workers=1, cpu=3))

    def told(kind: str) -> dict[str, Any] | None:
        return next((e for e in logged(out) if e["kind"] == kind), None)

    notice = await eventually(lambda: told("job-evicting"), what="the learner told")
    assert notice["pod"] == "low-learner", notice
    assert notice_s - LATE_S <= notice["left"] <= notice_s + EARLY_S, notice
    end = notice["t"] + notice["left"]
    if answers:  # the learner waits on the gate: the notice runs on meanwhile
        await under_notice(cluster, client, capsys, end)
        gate.open()
    high = await client.wait("high", stages=["Running"], timeout_s=30)

    stopped = terms(out)
    assert set(stopped) == {"low-learner.0", "low-actors-0.0"}, stopped
    said = {e.kind: e.message for e in await client.events("low")}
    assert "the whole job in" in said["EvictionNotice"], said
    if answers:
        answered = told("answering")
        assert answered is not None and all(answered["t"] < t for t in stopped.values())
        assert all(t < end - notice_s / 2 for t in stopped.values()), stopped  # at once
        assert seconds(high.status.leader.start_time) < end - notice_s / 2
        assert "the learner confirmed a checkpoint" in said["Checkpointed"], said
        assert "NoticeEnded" not in said
    else:  # told of each pod's notice: of its own first, as the whole job's
        actor = told("evicting")
        assert actor is not None and actor["pod"] == "low-actors-0", logged(out)
        assert abs(actor["t"] + actor["left"] - end) < EARLY_S, (actor, notice)
        assert actor["t"] < min(stopped.values()), (actor, stopped)
        assert all(end - EARLY_S <= t <= end + LATE_S + 1 for t in stopped.values()), stopped
        assert "the whole job evicted: the notice ended" in said["NoticeEnded"], said
        assert "Checkpointed" not in said
    assert said["Pending"].startswith("Preempted: preempted by job high"), said
    assert (await client.get("low")).status.stage == "Pending"

    # Once the high job is gone, the low one runs again; no restart is counted.
    await client.delete("high")
    await eventually((out / "low-learner.1.ready").exists, what="the learner again")
    low = await client.wait("low", stages=["Running"], timeout_s=30)
    assert low.status.leader_restarts == 0 and dict(low.status.worker_set_restarts) == {}
    assert not low.status.leader.HasField("evict_at")
    await client.delete("low")


async def under_notice(
    cluster: DevCluster, client: AsyncClient, capsys: pytest.CaptureFixture[str], end: float
) -> None:
    """under_notice checks that the low job's pods show when they are evicted, in GetJob and
    in `arranger get -o json`, while the high job waits for them."""
    job = await client.get("low")
    for pod in [job.status.leader, *job.status.workers]:
        assert pod.state == "Running" and abs(seconds(pod.evict_at) - end) < LATE_S, pod
    assert (await client.get("high")).status.stage == "Pending"
    code, said, _ = await arranger_cli(
        capsys, "--server", cluster.address, "get", "low", "-o", "json"
    )
    shown = json.loads(said)["status"]
    assert code == 0 and shown["leader"]["evictAt"] and shown["workers"][0]["evictAt"], shown
