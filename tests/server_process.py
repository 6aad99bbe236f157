"""server_process: arranger-server as a real process of its own (a process group on a fixed
port), for tests that kill, stop or resume it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from arranger.agent.agent import Agent
from arranger.agent.config import AgentConfig
from tests.conftest import NODE, eventually

SETTINGS = {
    "schedulePeriodSeconds": 0.2,
    "heartbeatIntervalSeconds": 0.2,
    "fenceTimeoutSeconds": 15,
    "nodeTimeoutSeconds": 30,
    "killGraceSeconds": 2,
    "restartBackoffSeconds": {"initial": 0.05, "max": 0.2},
}


class ServerProcess:
    """ServerProcess runs arranger-server as its own process group on a fixed port."""

    def __init__(self, directory: Path, init: bool = True, **settings: object) -> None:
        """`settings` add to (or replace) SETTINGS; without `init` the store must exist."""
        directory.mkdir(parents=True, exist_ok=True)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.config = directory / "server.yaml"
        settings = {
            **SETTINGS,
            "listen": self.address,
            "dataDir": str(directory / "store"),
            "insecure": True,
            "httpListen": "127.0.0.1:0",
            **settings,
        }
        self.config.write_text(yaml.safe_dump(settings))
        self.log = directory / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        if init:  # the store of a new cluster is made once, by `--init`, as an operator would
            subprocess.run([*self.command, "--init"], check=True, capture_output=True)

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "arranger.server.main", "--config", str(self.config)]

    async def start(self) -> None:
        self.launch()
        await eventually(self.serving, timeout_s=30, what=f"the server to serve ({self.log})")

    def launch(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    async def serving(self) -> bool:
        async with grpc.aio.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
            except grpc.aio.AioRpcError:
                return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def signal(self, number: int) -> None:
        """signal sends a signal to the server's process group."""
        assert self.proc is not None
        os.killpg(self.proc.pid, number)

    def kill(self) -> None:
        """kill: SIGKILL to the whole process group, and wait until it is gone."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # a stopped process too
            self.proc.wait(timeout=10)


def start_agents(directory: Path, servers: str, count: int) -> list[Agent]:
    """start_agents: `count` real agents (node-0, node-1, ...) of exactly NODE's size that follow
    the servers listed (comma-separated) as they fail over; the caller stops them."""
    agents = []
    for i in range(count):
        config = AgentConfig(
            server=servers,
            node_name=f"node-{i}",
            address="127.0.0.1",
            data_dir=directory / f"agent-{i}",
            path_prepend=(str(Path(sys.executable).parent),),
            fence_timeout_s=40,
            heartbeat_interval_s=0.2,
            reconnect_max_s=0.5,
            stop_pods_on_exit=True,
        )
        agents.append(Agent(config, NODE))
        agents[-1].start()
    return agents
