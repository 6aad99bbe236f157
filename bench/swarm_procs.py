"""swarm_procs: the processes bench/swarm.py starts and reads: the server, the swarm of
simulated agents (bench/swarm_agent.py) and py-spy; each in a session of its own, pinned to a
core when asked, and stopped with all it started."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from arranger.server.config import FENCE_MARGIN_S, ServerConfig, load_server_config
from arranger.server.main import init_store

HERE = Path(__file__).resolve().parent
MIB = 2**20
CLOCK_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """cpu_s: user + system CPU seconds of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) * CLOCK_TICK_S


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def pinned(cpu: int | None) -> list[str]:
    return [] if cpu is None else ["taskset", "-c", str(cpu)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = 20.0) -> None:
    """stop_group ends a process started in a session of its own, and all it started."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class Server:
    """Server is an arranger-server process with a fresh store under `root`."""

    def __init__(self, root: Path, args: argparse.Namespace, submits: int) -> None:
        self.root = root
        self.address = f"127.0.0.1:{free_port()}"
        self.config = root / "server.yaml"
        fence_s = args.node_timeout_s - args.heartbeat_s - FENCE_MARGIN_S - 1
        self.fence_s = fence_s if fence_s >= args.heartbeat_s else 0.0  # 0: no fencing
        settings = {
            "listen": self.address,
            "dataDir": str(root / "store"),
            "insecure": True,
            "httpListen": "",
            "heartbeatIntervalSeconds": args.heartbeat_s,
            "nodeTimeoutSeconds": args.node_timeout_s,
            "fenceTimeoutSeconds": self.fence_s,
            # Every job of the run is unfinished at the end; the defaults are 1,000 and 10,000.
            "limits": {
                "jobsPerUser": max(1000, 2 * submits),
                "podsPerUser": max(10_000, 8 * submits),
            },
        }
        self.config.write_text(yaml.safe_dump(settings))
        self.settings: ServerConfig = load_server_config(self.config)  # raises ConfigError
        self.cpu = args.server_cpu
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def init(self) -> None:
        await init_store(self.settings)  # what `arranger-server --init` does, without its start-up

    def start(self) -> None:
        command = [sys.executable, "-m", "arranger.server.main", "--config", str(self.config)]
        with (self.root / "server.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [*pinned(self.cpu), *command, "--log-level", "warning"],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc)


class Swarm:
    """Swarm is one bench/swarm_agent.py process and the events it prints."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.events: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(
        cls, root: Path, server: str, first: int, count: int, args: argparse.Namespace
    ) -> Swarm:
        command = [
            *pinned(args.swarm_cpu),
            sys.executable,
            str(HERE / "swarm_agent.py"),
            "--server",
            server,
            "--first",
            str(first),
            "--count",
            str(count),
            "--resync-s",
            str(args.resync_s),
            "--seed",
            str(first),
            "--usage-s",
            str(getattr(args, "usage_s", 0.0)),
        ]
        with (root / f"swarm-{first}.log").open("ab") as log:
            proc = await asyncio.create_subprocess_exec(
                *command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                limit=16 * MIB,
            )
        return cls(proc)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            event = json.loads(line)
            self.queue(event["event"]).put_nowait(event)

    def queue(self, kind: str) -> asyncio.Queue[dict[str, Any]]:
        return self.events.setdefault(kind, asyncio.Queue())

    async def send(self, **command: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")
        await self.proc.stdin.drain()

    async def event(self, kind: str, timeout_s: float) -> dict[str, Any]:
        try:
            async with asyncio.timeout(timeout_s):
                return await self.queue(kind).get()
        except TimeoutError:
            raise RuntimeError(
                f"the swarm did not report {kind!r} within {timeout_s:g} s"
            ) from None

    async def ask(self, timeout_s: float = 30.0, **command: Any) -> dict[str, Any]:
        await self.send(**command)
        return await self.event("stats" if command["cmd"] == "stats" else "silenced", timeout_s)

    async def stop(self) -> None:
        with contextlib.suppress(OSError):
            await self.send(cmd="stop")
        try:
            async with asyncio.timeout(20):
                await self.proc.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            await self.proc.wait()
        self._reader.cancel()


class Profiler:
    """Profiler runs py-spy on the server for one phase (nothing without --profile)."""

    def __init__(self, directory: Path | None, cpu: int | None) -> None:
        self.directory = directory
        self.cpu = cpu
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, pid: int, name: str) -> None:
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        out = self.directory / f"{name}.txt"
        self.proc = subprocess.Popen(
            [
                *pinned(self.cpu),
                "py-spy",
                "record",
                "-f",
                "raw",
                "-o",
                str(out),
                "-p",
                str(pid),
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def stop(self) -> None:
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGINT)  # py-spy writes its file on SIGINT
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                stop_group(self.proc, 0)
            self.proc = None
