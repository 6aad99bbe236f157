"""kill -9 of arranger-agent, then a restart over the same data directory: the pods it launched
run on and are adopted; a pod that ended while no agent watched is reported with its exit
code; one whose exit code nobody recorded is Lost (and replaced), never Succeeded.

The agent is a real `arranger-agent` process; its pods run in their own sessions, so they
outlive it as they would outlive a crashed agent on a real machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import psutil
import pytest
import yaml

from arranger.client.sdk import AsyncClient
from arranger.server.app import ArrangerServer
from tests.conftest import FAST, Gate, eventually, job_spec
from tests.containers import IMAGE, busybox_image, containers_of


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class AgentProcess:
    """AgentProcess runs arranger-agent as its own process group."""

    def __init__(self, directory: Path, server: str) -> None:
        self.config = directory / "agent.yaml"
        settings = {
            "server": server,
            "nodeName": "crashy",
            "address": "127.0.0.1",
            "dataDir": str(directory / "agent"),
            "runAsRoot": True,
        }
        self.config.write_text(yaml.safe_dump(settings))
        self.log = directory / "agent.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "arranger.agent.main", "--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)


@contextlib.asynccontextmanager
async def one_node(directory: Path) -> AsyncIterator[tuple[AsyncClient, AgentProcess]]:
    config = dataclasses.replace(FAST, listen="127.0.0.1:0", data_dir=directory / "server")
    server = ArrangerServer(config)
    await server.start()
    agent = AgentProcess(directory, f"127.0.0.1:{server.port}")
    try:
        agent.start()
        async with AsyncClient(f"127.0.0.1:{server.port}", timeout_s=10) as client:
            yield client, agent
    finally:
        agent.signal(signal.SIGTERM)  # a clean stop: it stops its pods
        await server.stop()


def ready(client: AsyncClient) -> object:
    async def check() -> bool:
        return any(n.name == "crashy" and n.state == "Ready" for n in await client.nodes())

    return check


def running(client: AsyncClient, job: str, workers: int) -> Callable[[], Awaitable[bool]]:
    """running: a check that the job runs with that many workers."""

    async def check() -> bool:
        st = (await client.get(job)).status
        return st.stage == "Running" and st.running_workers == workers

    return check


@pytest.fixture
async def second_gate() -> AsyncIterator[Gate]:
    async with Gate() as g:
        yield g


@pytest.mark.timeout(120)
async def test_a_restarted_agent_adopts_its_pods_and_keeps_their_exit_codes(
    tmp_path: Path, gate: Gate, second_gate: Gate
) -> None:
    release, done = gate, second_gate

    def waits_for(which: Gate, code: int) -> list[str]:
        return which.command(tmp_path, "release" if which is release else "done", code)

    spec = job_spec("adopted", leader=waits_for(release, 0))
    spec["spec"]["workerSets"] = [  # type: ignore[index]
        {
            "name": "finishes",
            "counts": 1,
            "template": {
                "command": waits_for(done, 3),
                "resources": {"cpu": 0.1, "memory": "64Mi"},
            },
        },
        {
            "name": "doomed",
            "counts": 1,
            "template": {
                "command": waits_for(release, 0),
                "resources": {"cpu": 0.1, "memory": "64Mi"},
            },
        },
    ]
    spec["spec"]["minWorkersNum"] = 0  # type: ignore[index]
    pids: list[int] = []
    try:
        async with one_node(tmp_path) as (client, agent):
            await eventually(ready(client), what="the agent to join")
            await client.submit(spec)

            await eventually(running(client, "adopted", 2), what="the job to run")
            before = (await client.get("adopted")).status
            finishes, doomed = sorted(before.workers, key=lambda w: w.worker_set != "finishes")
            pids += [before.leader.pid, finishes.pid, doomed.pid]

            agent.signal(signal.SIGKILL)  # the agent crashes; its pods run on
            assert all(alive(p) for p in pids)
            done.open()  # the finishing worker exits 3 while no agent watches
            await eventually(lambda: not alive(finishes.pid), what="the worker to exit")
            os.killpg(doomed.pid, signal.SIGKILL)  # gone without a trace of its exit code
            await eventually(lambda: not alive(doomed.pid), what="the doomed worker to die")
            agent.start()

            async def settled() -> bool:
                st = (await client.get("adopted")).status
                by_set = {w.worker_set: w for w in st.workers}
                return by_set["finishes"].state == "Failed" and by_set["doomed"].attempt >= 1

            await eventually(settled, what="the restarted agent's reports")
            after = (await client.get("adopted")).status
            assert (after.leader.pid, after.leader.attempt) == (before.leader.pid, 0)
            assert after.leader.state == "Running", "the leader was adopted, not restarted"
            by_set = {w.worker_set: w for w in after.workers}
            assert by_set["finishes"].exit_code == 3
            messages = [e.message for e in await client.events("adopted")]
            # The first attempt's own exit code, recorded while no agent ran; the doomed one Lost.
            assert "adopted-finishes-0 failed with exit code 3; restart 1 of 3" in messages
            assert any(  # lost with its agent: it runs again, no restart spent
                m.startswith("adopted-doomed-0 lost (AgentRestarted")
                and "it runs again, no restart spent" in m
                for m in messages
            )
            release.open()
            assert (await client.wait("adopted", timeout_s=30)).status.stage == "Succeeded"
    finally:
        for pid in pids:  # whatever a failed assertion left running
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


@pytest.mark.timeout(120)
async def test_a_restarted_agent_adopts_its_containers(tmp_path: Path) -> None:
    podman = busybox_image()
    release = tmp_path / "release"
    release.mkdir()
    spec = job_spec("boxed", leader=["sh", "-c"], worker=["sh", "-c"])
    for template in (spec["spec"]["leader"]["template"], spec["spec"]["workerSets"][0]["template"]):
        template.update(image=IMAGE, args=["while [ ! -e /release/go ]; do sleep 0.1; done"])
    spec["spec"]["volumes"] = [
        {"name": "release", "hostPath": str(release), "mountPath": "/release"}
    ]
    async with one_node(tmp_path) as (client, agent):
        await eventually(ready(client), what="the agent to join")
        await client.submit(spec)

        await eventually(running(client, "boxed", 1), what="the job to run")
        before = (await client.get("boxed")).status
        agent.signal(signal.SIGKILL)  # the agent crashes; its containers run on
        assert len(containers_of(podman, "crashy")) == 2
        agent.start()

        # Once the new agent reports a container again, nothing of the old one is unknown.
        await eventually(
            lambda: (tmp_path / "agent.log").read_text().count("pod adopted") == 2,
            what="the restarted agent to adopt both containers",
        )
        after = (await client.get("boxed")).status
        assert (after.leader.pid, after.leader.attempt) == (before.leader.pid, 0)
        assert (after.workers[0].pid, after.workers[0].attempt) == (before.workers[0].pid, 0)
        (release / "go").touch()
        done = (await client.wait("boxed", timeout_s=30)).status
        assert (done.stage, done.leader.attempt) == ("Succeeded", 0), done.message
        assert not any("lost" in e.message for e in await client.events("boxed"))
        await eventually(lambda: containers_of(podman, "crashy") == [], what="containers removed")
