"""A command that cannot be started, on a real cluster: the job says so at once (a leader fails
the job with CommandNotFound or CommandNotExecutable, a worker spends its set), with no restart
and no back-off, and `arranger get` and `arranger logs` show why. Restart back-off is a minute
here, so a job that ends within seconds never waited for one."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from arranger.server.controller import ControllerConfig
from arranger.v1 import job_pb2
from tests.client.test_cli import arranger
from tests.conftest import FAST, eventually, job_spec, running_cluster, script
from tests.containers import IMAGE, busybox_image

SLOW_BACKOFF = dataclasses.replace(
    FAST,
    controller=ControllerConfig(
        backoff_initial_s=60.0, backoff_max_s=60.0, kill_grace_s=2.0, node_timeout_s=12.0
    ),
)
SLEEP = "import signal; signal.pause()  # runs until stopped\n"


@pytest.fixture
async def slow_cluster(tmp_path: Path) -> AsyncIterator[DevCluster]:
    async with running_cluster(tmp_path / "cluster", config=SLOW_BACKOFF) as c:
        yield c


async def test_a_leader_that_cannot_start_fails_the_job_at_once(
    slow_cluster: DevCluster, tmp_path: Path
) -> None:
    async with AsyncClient(slow_cluster.address) as client:
        began = time.monotonic()
        worker = script(tmp_path, "actor", SLEEP)
        await client.submit(job_spec("nocmd", leader=["no-such-command-xyz", "-x"], worker=worker))
        done = (await client.wait("nocmd", timeout_s=30)).status
        assert time.monotonic() - began < 10
        assert (done.stage, done.reason) == ("Failed", "CommandNotFound")
        start = "nocmd-learner: cannot start `no-such-command-xyz`: No such file or directory"
        assert done.message.startswith(start) and "(not found in the pod's PATH)" in done.message
        leader = done.leader
        assert (leader.attempt, done.leader_restarts, leader.exit_code) == (0, 0, 127)
        assert not any(e.kind == "Restarting" for e in await client.events("nocmd"))
        log = b"".join([c async for c in client.logs("nocmd")]).decode()
        assert log == f"arranger: {leader.reason.partition(': ')[2]}\n"
    code, out, _ = await arranger("get", "nocmd", server=slow_cluster.address)
    assert code == 0 and "CommandNotFound" in out
    code, out, err = await arranger("logs", "nocmd", server=slow_cluster.address)
    assert code == 0 and "arranger: cannot start `no-such-command-xyz`" in out, err


async def test_a_file_that_cannot_be_run_is_not_executable(
    slow_cluster: DevCluster, tmp_path: Path
) -> None:
    data = tmp_path / "data.txt"
    data.write_text("not a program\n")  # mode 0644
    async with AsyncClient(slow_cluster.address) as client:
        worker = script(tmp_path, "actor", SLEEP)
        await client.submit(job_spec("noexec", leader=[str(data)], worker=worker))
        done = (await client.wait("noexec", timeout_s=30)).status
        assert (done.stage, done.reason) == ("Failed", "CommandNotExecutable")
        assert done.message == f"noexec-learner: cannot start `{data}`: Permission denied"
        assert (done.leader.attempt, done.leader.exit_code) == (0, 126)


async def test_a_worker_set_that_cannot_start_is_spent_without_back_off(
    slow_cluster: DevCluster, tmp_path: Path
) -> None:
    leader = script(tmp_path, "learner", SLEEP)
    async with AsyncClient(slow_cluster.address) as client:
        # minWorkersNum 0: the job runs on without its workers.
        spec = job_spec("lonely", leader=leader, worker=["no-such-actor"], workers=3)
        spec["spec"]["minWorkersNum"] = 0
        await client.submit(spec)

        async def spent() -> job_pb2.JobStatus | None:
            st = (await client.get("lonely")).status
            return st if all(w.state == "Failed" for w in st.workers) else None

        st = await eventually(spent, timeout_s=10, what="every worker to fail")
        assert [w.attempt for w in st.workers] == [0, 0, 0]
        assert st.stage == "Running" and dict(st.worker_set_restarts) == {"actors": 3}
        failed = [e for e in await client.events("lonely") if e.kind == "WorkerFailed"]
        assert len(failed) == 3 and "cannot start `no-such-actor`" in failed[0].message
        log = b"".join([c async for c in client.logs("lonely", pod="lonely-actors-1")]).decode()
        assert log.startswith("arranger: cannot start `no-such-actor`: No such file or directory")

        # minWorkersNum 2: the spent set leaves too few workers, and the job fails.
        spec = job_spec("needy", leader=leader, worker=["no-such-actor"], workers=3)
        spec["spec"]["minWorkersNum"] = 2
        await client.submit(spec)
        done = (await client.wait("needy", timeout_s=30)).status
        assert (done.stage, done.reason) == ("Failed", "TooFewWorkers")
        assert "cannot start `no-such-actor`" in done.message
        assert all(w.attempt == 0 for w in done.workers)


async def test_a_container_command_the_image_lacks_fails_the_job_at_once(
    slow_cluster: DevCluster, tmp_path: Path
) -> None:
    busybox_image()  # skips where podman cannot run the test image
    spec = job_spec("boxed", leader=["no-such-command-xyz"], worker=script(tmp_path, "a", SLEEP))
    spec["spec"]["leader"]["template"]["image"] = IMAGE
    async with AsyncClient(slow_cluster.address) as client:
        await client.submit(spec)
        done = (await client.wait("boxed", timeout_s=60)).status
        assert (done.stage, done.reason) == ("Failed", "ContainerCommandNotFound"), done.message
        assert done.message.startswith("boxed-learner: cannot start `no-such-command-xyz`: ")
        assert done.leader.attempt == 0 and done.leader_restarts == 0
        log = b"".join([c async for c in client.logs("boxed")]).decode()
        assert f"arranger: {done.message.partition(': ')[2]}\n" in log
