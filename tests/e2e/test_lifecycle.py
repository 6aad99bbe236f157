"""A job's whole life on a real cluster: server + 2 agents on 127.0.0.1, real processes."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import psutil
import pytest

from arranger.client.dev import DevCluster
from arranger.client.sdk import ArrangerError, AsyncClient
from tests.conftest import Gate, eventually, job_spec, script
from tests.e2e.test_elastic import arranger_cli

LEADER_WAITS_FOR_WORKERS = """
import json, os, pathlib, socket, sys, time
out = pathlib.Path(os.environ["ARRANGER_VOLUME_OUT"])
(out / "leader.json").write_text(json.dumps(dict(os.environ)))
server = socket.create_server(("0.0.0.0", int(os.environ["ARRANGER_PORT_RPC"])))
server.settimeout(0.1)
deadline = time.time() + 60
while len(list(out.glob("worker-*.json"))) < int(os.environ["ARRANGER_NUM_WORKERS"]):
    try:
        conn, _ = server.accept()
        conn.sendall(b"ok")
        conn.close()
    except socket.timeout:
        pass
    if time.time() > deadline:
        sys.exit(3)
"""

WORKER_WRITES_ENV = """
import json, os, pathlib, signal, socket, time

host, port = os.environ["ARRANGER_LEADER_HOST"], int(os.environ["ARRANGER_LEADER_PORT"])
reply = b""
for _ in range(600):
    try:
        with socket.create_connection((host, port), timeout=1) as s:
            reply = s.recv(2)
        break
    except OSError:
        time.sleep(0.05)
env = dict(os.environ, _connected=reply.decode())
out = pathlib.Path(os.environ["ARRANGER_VOLUME_OUT"])
rank = os.environ["ARRANGER_WORKER_RANK"]
(out / f".w{rank}").write_text(json.dumps(env))
(out / f".w{rank}").rename(out / f"worker-{rank}.json")
signal.pause()  # runs until stopped
"""


@pytest.fixture
async def cluster(cluster_on_each_store: DevCluster) -> DevCluster:
    """cluster: every test here runs on a SQLite store and on a PostgreSQL one."""
    return cluster_on_each_store


SLEEP = "import signal; signal.pause()  # runs until stopped\n"


async def test_job_runs_to_success_and_workers_get_the_documented_environment(
    client: AsyncClient, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    spec = job_spec(
        "contract",
        leader=script(tmp_path, "leader", LEADER_WAITS_FOR_WORKERS),
        worker=script(tmp_path, "worker", WORKER_WRITES_ENV),
        workers=3,
        minWorkersNum=4,
        volumes=[{"name": "out", "hostPath": str(out)}],
    )
    spec["spec"]["workerSets"].append(
        {"name": "evaluators", "counts": 1, "template": spec["spec"]["workerSets"][0]["template"]}
    )
    submitted = await client.submit(spec)
    assert submitted.metadata.id and submitted.status.submit_time.seconds > 0
    done = await client.wait("contract", timeout_s=60)
    assert done.status.stage == "Succeeded", done.status.message
    assert done.status.reason == "LeaderSucceeded"

    kinds = [e.kind for e in await client.events("contract")]
    stages = [k for k in kinds if k in ("Submitted", "Starting", "Running", "Succeeded")]
    assert stages == ["Submitted", "Starting", "Running", "Succeeded"]

    envs = [json.loads(p.read_text()) for p in sorted(out.glob("worker-*.json"))]
    assert sorted(int(e["ARRANGER_WORKER_RANK"]) for e in envs) == [0, 1, 2, 3]
    by_rank = {int(e["ARRANGER_WORKER_RANK"]): e for e in envs}
    assert [
        (by_rank[r]["ARRANGER_WORKER_SET"], by_rank[r]["ARRANGER_WORKER_INDEX"]) for r in range(4)
    ] == [
        ("actors", "0"),
        ("actors", "1"),
        ("actors", "2"),
        ("evaluators", "0"),
    ]
    for env in envs:
        assert env["_connected"] == "ok", "the leader address was not connectable"
        assert env["ARRANGER_LEADER_ADDR"] == done.status.leader_address
        assert env["ARRANGER_ROLE"] == "worker" and env["ARRANGER_NUM_WORKERS"] == "4"
        assert env["ARRANGER_JOB_NAME"] == "contract" and env["ARRANGER_JOB_ID"] == done.metadata.id
        assert env["ARRANGER_NODE_NAME"] in ("dev-0", "dev-1")
        assert env["ARRANGER_RESTART_COUNT"] == "0" and env["CUDA_VISIBLE_DEVICES"] == ""
        assert env["ARRANGER_VOLUME_OUT"] == str(out) and env["ARRANGER_SCRATCH_DIR"]
    leader_env = json.loads((out / "leader.json").read_text())
    assert leader_env["ARRANGER_ROLE"] == "leader"
    assert leader_env["ARRANGER_LEADER_PORT"] == leader_env["ARRANGER_PORT_RPC"]
    assert done.status.leader_address.endswith(":" + leader_env["ARRANGER_PORT_RPC"])


async def test_a_transient_exit_code_is_retried_without_spending_the_restart_limit(
    cluster: DevCluster, client: AsyncClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A learner that fails twice with an exit code its spec calls transient (as an NCCL
    timeout's would be) runs a third time though restartLimit is 0, and the job succeeds;
    `get` shows the restarts and retries spent and left."""
    leader = script(
        tmp_path,
        "flaky",
        "import os, sys; n = int(os.environ['ARRANGER_RESTART_COUNT']); sys.exit(75 if n < 2 else 0)\n",
    )
    spec = job_spec("flaky", leader=leader, worker=script(tmp_path, "w", SLEEP), restartLimit=0)
    spec["spec"]["leader"]["retryOnExitCodes"] = [75]
    spec["spec"]["minWorkersNum"] = 0
    await client.submit(spec)
    done = await client.wait("flaky", timeout_s=60)
    st = done.status
    assert st.stage == "Succeeded" and st.leader.attempt == 2, st.message
    assert st.leader_restarts == 0 and st.leader_retries == 2 and st.retry_limit == 5
    assert [e.kind for e in await client.events("flaky")].count("Retrying") == 2
    code, shown, _ = await arranger_cli(capsys, "--server", cluster.address, "get", "flaky")
    assert code == 0
    assert "leader 0 of 0 (0 left), actors 0 of 0 (0 left)" in shown
    assert "leader 2 of 5 (3 left; exit 75)" in shown


async def test_a_failing_leader_is_restarted_restart_limit_times_then_the_job_fails(
    client: AsyncClient, tmp_path: Path
) -> None:
    leader = script(
        tmp_path,
        "crash",
        "import os, sys; print('attempt', os.environ['ARRANGER_RESTART_COUNT']); sys.exit(1)\n",
    )
    await client.submit(
        job_spec("crashy", leader=leader, worker=script(tmp_path, "w", SLEEP), restartLimit=2)
    )
    done = await client.wait("crashy", timeout_s=60)
    st = done.status
    assert st.stage == "Failed" and st.reason == "LeaderFailed"
    assert st.leader_restarts == 2 and st.leader.attempt == 2
    assert "exit code 1" in st.message and "restartLimit 2" in st.message
    assert [e.kind for e in await client.events("crashy")].count("Restarting") == 2
    for attempt in range(3):  # every attempt keeps its own log
        text = b"".join([c async for c in client.logs("crashy", attempt=attempt)])
        assert text == f"attempt {attempt}\n".encode()


async def test_a_failing_worker_is_restarted_and_the_job_keeps_running(
    client: AsyncClient, tmp_path: Path
) -> None:
    worker = script(
        tmp_path,
        "flaky",
        "import os, signal, sys\n"
        "if os.environ['ARRANGER_WORKER_RANK'] == '1' and os.environ['ARRANGER_RESTART_COUNT'] == '0':\n"
        "    sys.exit(7)\n"
        "signal.pause()\n",
    )
    await client.submit(
        job_spec("flaky", leader=script(tmp_path, "l", SLEEP), worker=worker, workers=2)
    )

    async def restarted_and_running() -> bool:
        st = (await client.get("flaky")).status
        w1 = st.workers[1]
        return (
            st.stage == "Running"
            and w1.attempt == 1
            and w1.state == "Running"
            and st.running_workers == 2
        )

    await eventually(restarted_and_running, what="worker 1 restarted and running")
    st = (await client.get("flaky")).status
    assert st.worker_set_restarts["actors"] == 1 and st.leader_restarts == 0
    assert st.workers[0].attempt == 0
    await client.stop("flaky")
    assert (await client.wait("flaky", timeout_s=30)).status.stage == "Succeeded"


@pytest.mark.parametrize("policy", ["All", "Running", "None"])
async def test_stop_succeeds_the_job_and_clean_pod_policy_decides_what_is_stopped(
    cluster: DevCluster, client: AsyncClient, tmp_path: Path, policy: str
) -> None:
    name = f"stop-{policy.lower()}"
    sleep = script(tmp_path, "sleep", SLEEP)
    await client.submit(job_spec(name, leader=sleep, workers=2, cleanPodPolicy=policy))
    running = await client.wait(name, stages=["Running"], timeout_s=30)
    pids = [running.status.leader.pid, *(w.pid for w in running.status.workers)]
    assert all(pids) and all(psutil.pid_exists(p) for p in pids)
    job_id = running.metadata.id
    scratch = [
        cluster.data_dir / "agents" / pod.node / "scratch" / job_id / pod.name
        for pod in [running.status.leader, *running.status.workers]
    ]
    assert all(d.is_dir() for d in scratch)

    await client.stop(name)
    done = await client.wait(name, timeout_s=30)
    assert done.status.stage == "Succeeded" and done.status.reason == "Stopped"
    if policy == "None":
        assert all(_alive(p) for p in pids), "cleanPodPolicy None must leave processes running"
        await client.delete(name)  # stops them
        await eventually(
            lambda: not any(_alive(p) for p in pids), what="processes stopped by delete"
        )
        return
    await eventually(lambda: not any(_alive(p) for p in pids), what="processes stopped")
    if policy == "All":
        await eventually(lambda: not any(d.exists() for d in scratch), what="scratch removed")
    else:
        assert all(d.is_dir() for d in scratch), "cleanPodPolicy Running keeps scratch directories"


async def test_a_job_larger_than_the_cluster_is_failed_with_a_reason(
    client: AsyncClient, tmp_path: Path
) -> None:
    """Queued anyway (a node might join), a job no registered node could hold fails once the
    cluster it waited for is known to be the whole of it; without asking, it is refused."""
    sleep = script(tmp_path, "sleep", SLEEP)
    huge = job_spec("huge", leader=sleep, workers=3, cpu=4, minWorkersNum=3)
    with pytest.raises(ArrangerError, match="--queue-anyway"):
        await client.submit(huge)
    await client.submit(huge, queue_anyway=True)
    done = await client.wait("huge", timeout_s=30)
    assert done.status.stage == "Failed" and done.status.schedule_state == "ScheduledFailed"
    assert "cannot fit even the empty cluster" in done.status.message
    assert "it needs more cpu than the whole cluster has (2 ready nodes)" in done.status.message
    assert all(
        p.state == "Killed" and not p.node for p in [done.status.leader, *done.status.workers]
    )


async def test_a_job_that_fits_only_after_another_finishes_waits_then_runs(
    client: AsyncClient, tmp_path: Path, gate: Gate
) -> None:
    first_leader = gate.command(tmp_path, "first")
    sleep = script(tmp_path, "sleep", SLEEP)
    quick = script(tmp_path, "quick", "print('done')\n")
    await client.submit(job_spec("first", leader=first_leader, worker=sleep, cpu=3))
    await client.wait("first", stages=["Running"], timeout_s=30)
    await client.submit(job_spec("second", leader=quick, worker=sleep, cpu=3))

    async def waiting() -> bool:
        st = (await client.get("second")).status
        return st.schedule_state == "Unscheduled" and "insufficient cpu" in st.message

    await eventually(waiting, what="second to wait for resources")
    assert (await client.get("second")).status.stage == "Pending"
    gate.open()
    first = await client.wait("first", timeout_s=30)
    second = await client.wait("second", timeout_s=30)
    assert first.status.stage == "Succeeded" and second.status.stage == "Succeeded"
    assert second.status.start_time.ToNanoseconds() >= first.status.finish_time.ToNanoseconds()


async def test_an_invalid_spec_is_refused_with_its_field_path_and_nothing_is_stored(
    client: AsyncClient, tmp_path: Path
) -> None:
    spec = job_spec("bad", leader=["true"], priority=11)
    spec["spec"]["workerSets"][0]["counts"] = 0
    with pytest.raises(ArrangerError) as caught:
        await client.submit(spec)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.priority: must be between 1 and 10" in caught.value.message
    assert "spec.workerSets[0].counts: must be >= 1" in caught.value.message
    assert await client.jobs() == []
    with pytest.raises(ArrangerError) as missing:
        await client.get("bad")
    assert missing.value.code == grpc.StatusCode.NOT_FOUND


async def test_logs_follow_streams_until_the_pod_ends(client: AsyncClient, tmp_path: Path) -> None:
    leader = script(
        tmp_path,
        "count",
        "import time\nfor i in range(5):\n    print(i, flush=True)\n    time.sleep(0.05)\n",
    )
    await client.submit(job_spec("counter", leader=leader, worker=script(tmp_path, "s", SLEEP)))
    await client.wait("counter", stages=["Starting", "Running", "Succeeded"], timeout_s=30)
    text = b"".join([chunk async for chunk in client.logs("counter", follow=True)])
    assert text == b"0\n1\n2\n3\n4\n"
    nodes = await client.nodes()
    assert [n.name for n in nodes] == ["dev-0", "dev-1"] and all(n.state == "Ready" for n in nodes)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_a_program_that_does_not_exist_fails_with_a_clear_reason(
    client: AsyncClient, tmp_path: Path
) -> None:
    await client.submit(
        job_spec("missing", leader=["no-such-program-here"], worker=["true"], restartLimit=0)
    )
    done = await client.wait("missing", timeout_s=30)
    leader = done.status.leader
    assert done.status.stage == "Failed" and leader.exit_code == 127
    assert leader.reason.startswith(
        "CommandNotFound: cannot start `no-such-program-here`: No such file or directory"
    )
    log = b"".join([c async for c in client.logs("missing")]).decode()
    assert "arranger: cannot start `no-such-program-here`" in log
