"""Shared fixtures: a real cluster (server + 2 agents on 127.0.0.1, real processes) and helpers.

Nodes are given an exact size (4 cores, 8 GiB) so placement is predictable; processes, gRPC,
SQLite and signals are all real. Timings are shortened through configuration, never by
sleeping in tests: tests wait on conditions with deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from arranger.agent.discovery import Capacity
from arranger.client.dev import DevCluster, DevOptions
from arranger.client.sdk import AsyncClient
from arranger.sched import SchedulerConfig
from arranger.server.access import SubmitPolicy
from arranger.server.app import ArrangerServer
from arranger.server.config import ServerConfig
from arranger.server.controller import ControllerConfig
from arranger.server.store import sqlite_url
from tests.postgres import SERVERS, PostgresServer, missing, postgres_server


def pytest_configure(config: pytest.Config) -> None:
    """Logins that dev clusters leave (arranger.client.logins) go to a state directory of the
    run's own, which clients started by the tests inherit, never to the account's real one."""
    home = tempfile.mkdtemp(prefix="arranger-tests-state-")
    config.stash[STATE_HOME] = home
    os.environ["XDG_STATE_HOME"] = home


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(config.stash.get(STATE_HOME, ""), ignore_errors=True)


STATE_HOME = pytest.StashKey[str]()

GI = 2**30
NODE = Capacity(cpu_milli=4000, memory_bytes=8 * GI)
FAST = ServerConfig(
    schedule_period_s=0.2,
    heartbeat_interval_s=0.2,
    fence_timeout_s=5.0,
    controller=ControllerConfig(
        backoff_initial_s=0.05, backoff_max_s=0.2, kill_grace_s=2.0, node_timeout_s=12.0
    ),
    scheduler=SchedulerConfig(infeasible_timeout_s=0.5),
    policy=SubmitPolicy(allowed_host_paths=(tempfile.gettempdir(),)),  # where tmp_path lies
    init=True,
    http_listen="127.0.0.1:0",
)


LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[")  # a line a server logged


def printed(capsys: pytest.CaptureFixture[str]) -> str:
    """printed: what a command wrote, without the log lines of a server in this process."""
    lines = capsys.readouterr().out.splitlines(keepends=True)
    return "".join(line for line in lines if not LOG_LINE.match(line))


async def eventually(
    check: Callable[[], Awaitable[Any] | Any], timeout_s: float = 30.0, what: str = ""
) -> Any:
    """eventually polls `check` until it returns something truthy, or fails after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or check}")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running_cluster(
    data_dir: Path, capacity: Capacity = NODE, config: ServerConfig = FAST, agents: int = 2
) -> AsyncIterator[DevCluster]:
    """running_cluster: a server and `agents` agents whose nodes have exactly `capacity`."""
    options = DevOptions(agents=agents, port=0)
    c = DevCluster(options, data_dir, server_config=config, capacity=capacity)
    await c.start()
    try:
        yield c
    finally:
        await c.stop()


@contextlib.asynccontextmanager
async def bare_server(
    data_dir: Path, config: ServerConfig = FAST, server: ArrangerServer | None = None
) -> AsyncIterator[ArrangerServer]:
    """bare_server: a real server with no agents (nothing it accepts ever runs), on
    127.0.0.1:0; `server` is one made by the test (to change it before it starts)."""
    if server is None:
        server = ArrangerServer(
            dataclasses.replace(config, listen="127.0.0.1:0", data_dir=data_dir)
        )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[DevCluster]:
    async with running_cluster(tmp_path / "cluster") as c:
        yield c


@pytest.fixture
async def cluster_on_each_store(tmp_path: Path, store_url: str) -> AsyncIterator[DevCluster]:
    """cluster_on_each_store: the `cluster`, once with each store backend (see store_url)."""
    config = dataclasses.replace(FAST, store=store_url)
    async with running_cluster(tmp_path / "cluster", config=config) as c:
        yield c


@pytest.fixture
async def client(cluster: DevCluster) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(cluster.address, timeout_s=10) as c:
        yield c


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """postgres: one real PostgreSQL server for the whole run, started where first needed."""
    why = missing()
    if why:
        pytest.skip(why)
    with postgres_server() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """store_url: a new, empty store of each backend (a test taking it runs once for each)."""
    if request.param == "sqlite":
        return sqlite_url(tmp_path / "store" / "arranger.db")
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.new_database()


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Any:
    """Every test must stop every process it started (pods run as our children in-process)."""
    yield
    me = psutil.Process()
    deadline = time.monotonic() + 10
    while True:
        left = [p for p in me.children(recursive=True) if _left(p)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    assert not left, f"processes left behind: {[p.cmdline() for p in left]}"


def _left(process: psutil.Process) -> bool:
    """_left: a process still running that a test left (one may end while it is looked at)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE and not _kept(process)
    except psutil.Error:  # it ended meanwhile
        return False


def _kept(process: psutil.Process) -> bool:
    """_kept: a process of a server that serves the whole run (PostgreSQL), not a test's."""
    with contextlib.suppress(psutil.Error):
        return process.pid in SERVERS or process.ppid() in SERVERS
    return False


def script(directory: Path, name: str, code: str) -> list[str]:
    """script writes a Python program and returns the command that runs it."""
    path = directory / f"{name}.py"
    path.write_text(code)
    return [sys.executable, str(path)]


class Gate:
    """Gate holds pods until the test opens it, without polling: a pod running `command`
    connects to the gate and waits until the gate closes the connection, then exits."""

    def __init__(self) -> None:
        self._held: list[asyncio.StreamWriter] = []
        self._open = False
        self._server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> Gate:
        self._server = await asyncio.start_server(self._hold, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.open()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open:
            writer.close()
        else:
            self._held.append(writer)

    def open(self) -> None:
        """open lets every held pod go, and any that comes later."""
        self._open = True
        for writer in self._held:
            writer.close()
        self._held.clear()

    def command(self, directory: Path, name: str = "gated", exit_code: int = 0) -> list[str]:
        """command: a program that waits for the gate, then exits with exit_code."""
        code = (
            f"import socket\nsocket.create_connection(('127.0.0.1', {self.port})).recv(1)\n"
            f"raise SystemExit({exit_code})\n"
        )
        return script(directory, f"{name}-{exit_code}", code)


@pytest.fixture
async def gate() -> AsyncIterator[Gate]:
    async with Gate() as g:
        yield g


def job_spec(
    name: str,
    leader: list[str],
    worker: list[str] | None = None,
    workers: int = 1,
    cpu: float = 0.1,
    **spec: Any,
) -> dict[str, Any]:
    """job_spec: a TYJob as the YAML would say it, with small requests by default."""
    resources = {"cpu": cpu, "memory": "64Mi"}
    body: dict[str, Any] = {
        "leader": {
            "name": "learner",
            "template": {"command": leader, "resources": dict(resources)},
        },
        "workerSets": [
            {
                "name": "actors",
                "counts": workers,
                "template": {"command": worker or leader, "resources": dict(resources)},
            }
        ],
    }
    body.update(spec)
    return {"apiVersion": "arranger/v1", "kind": "TYJob", "metadata": {"name": name}, "spec": body}
