"""rootagent: a real agent running as root (this test process), connected to a real in-process
server, that tests give LaunchPod orders straight through the server's link to it, past the
server's validation. The server records the agent's pod reports instead of acting on them (it
would kill pods it never placed), so a test sees each pod's end as the server hears it."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from arranger.agent.agent import Agent
from arranger.agent.config import AgentConfig
from arranger.agent.discovery import Capacity
from arranger.server.app import ArrangerServer
from arranger.server.nodes import PodReport
from arranger.v1 import agent_pb2
from tests.conftest import FAST, NODE, eventually

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="a root agent needs this test to run as root")
NODE_NAME = "root-node"


@dataclasses.dataclass
class RootAgent:
    server: ArrangerServer
    agent: Agent
    reports: dict[str, PodReport]

    def launch(self, *orders: agent_pb2.LaunchPod) -> None:
        """launch sends the orders to the agent as the server would, unchecked."""
        commands = agent_pb2.Commands(launch=orders)
        self.server.links[NODE_NAME].send(agent_pb2.ServerMessage(commands=commands))

    async def ended(self, uid: str, timeout_s: float = 30) -> PodReport:
        """ended: the report of the pod's end, once the server has heard it."""

        def done() -> PodReport | None:
            report = self.reports.get(uid)
            return report if report is not None and report.state.terminal else None

        found: PodReport = await eventually(done, timeout_s, f"{uid} to end")
        return found

    def log(self, uid: str) -> str:
        return self.agent.supervisor.files.log_path(uid, 0).read_text(errors="replace")


@contextlib.asynccontextmanager
async def root_agent(
    data_dir: Path, capacity: Capacity = NODE, **settings: object
) -> AsyncIterator[RootAgent]:
    """root_agent: a server and one root agent over data_dir, whose node has `capacity`, with
    the given AgentConfig fields."""
    server = ArrangerServer(
        dataclasses.replace(FAST, listen="127.0.0.1:0", data_dir=data_dir / "server")
    )
    await server.start()
    reports: dict[str, PodReport] = {}

    async def record(node: str, got: list[PodReport], full: bool = False) -> None:
        reports.update((report.pod_uid, report) for report in got)

    server.hub.pod_reports = record  # type: ignore[method-assign]
    config = AgentConfig(
        server=f"127.0.0.1:{server.port}",
        node_name=NODE_NAME,
        address="127.0.0.1",
        data_dir=data_dir / "agent",
        limits=False,
        podman="",
        stop_pods_on_exit=True,
        **settings,  # type: ignore[arg-type]
    )
    agent = Agent(config, capacity)
    agent.start()
    try:
        await eventually(lambda: NODE_NAME in server.links, 30, "the agent to register")
        yield RootAgent(server, agent, reports)
    finally:
        await agent.stop()
        await server.stop()


@contextlib.contextmanager
def shared_dir() -> Iterator[Path]:
    """shared_dir: a directory every user can reach (pytest's own are private to root)."""
    with tempfile.TemporaryDirectory(prefix="arranger-test-") as top:
        os.chmod(top, 0o755)
        yield Path(top)


def order(uid: str, command: list[str], **fields: object) -> agent_pb2.LaunchPod:
    job, _, pod = uid.partition("/")
    return agent_pb2.LaunchPod(
        pod_uid=uid,
        attempt=0,
        job_id=job,
        pod_name=pod,
        command=command,
        cpu=0.1,
        **fields,  # type: ignore[arg-type]
    )


@contextlib.contextmanager
def local_users(count: int) -> Iterator[list[pwd.struct_passwd]]:
    """local_users: `count` accounts made for the test (useradd), removed after it."""
    if not ROOT:
        pytest.skip("making accounts needs root")
    prefix = f"arrt{uuid.uuid4().hex[:6]}"
    names: list[str] = []
    try:
        for i in range(count):
            name = f"{prefix}{i}"
            made = subprocess.run(
                ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                capture_output=True,
                text=True,
                check=False,
            )
            if made.returncode != 0:
                pytest.skip(f"cannot make accounts here: useradd: {made.stderr.strip()}")
            names.append(name)
        yield [pwd.getpwnam(name) for name in names]
    finally:
        for name in names:
            subprocess.run(["userdel", name], capture_output=True, check=False)
