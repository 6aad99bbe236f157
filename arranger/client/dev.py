"""dev runs a whole cluster in one process: a server with its SQLite file and N local agents.

It serves its owner alone, though it listens on 127.0.0.1, which every account of the machine
reaches: its agents show the server a secret kept in memory, and every other call needs a
token. Each start makes its owner an admin token that this run alone accepts (kept in the
server's memory, never in its store) and leaves it as the login of its address
(arranger.client.logins): a file only the owner reads, which the owner's `arranger` commands
and SDK clients find by themselves. The dashboard's URL, printed once, logs its browser in.

Each agent is its own node sharing this machine: with N agents each reports 1/N of the cores
and memory, so the cluster never promises more than the machine has. `--fake-gpus K` gives
every agent K fake GPUs (shown as fake in `arranger nodes`) for trying GPU jobs on a laptop.

`--demo` also submits the packaged CartPole job (one learner, two actors and up to six as it
asks for more), prints its progress and the learner's log as they happen, and exits 0 when it
Succeeds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import secrets
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from arranger import logsetup
from arranger.agent.agent import Agent
from arranger.agent.config import AgentConfig
from arranger.agent.discovery import Capacity
from arranger.client import render
from arranger.client.aio import FINISHED, AsyncClient
from arranger.client.channel import ArrangerError
from arranger.client.errors import UserFacingError
from arranger.client.logins import forget_login, state_dir, write_login
from arranger.client.messages import progress_of
from arranger.client.specfile import load_job_yaml
from arranger.identity import Principal, Role, local_principal
from arranger.security import new_token
from arranger.server.app import ArrangerServer
from arranger.server.config import ServerConfig
from arranger.server.controller_config import ControllerConfig
from arranger.server.store import StoreError
from arranger.signals import until_stop_signal
from arranger.v1 import job_pb2

DEFAULT_PORT = 50051
DEFAULT_DASHBOARD_PORT = 50080
DEMO_TIMEOUT_S = 180.0
console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)


class DevError(UserFacingError):
    """DevError: a dev cluster cannot start; the message says why, in a line."""


def add_dev_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--agents", type=int, default=2, help="number of local agents (nodes), default 2"
    )
    p.add_argument("--fake-gpus", type=int, default=0, metavar="K", help="fake GPUs per agent")
    p.add_argument("--gpu-model", default="FakeGPU", help="model name of the fake GPUs")
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"server port on 127.0.0.1 (default {DEFAULT_PORT})",
    )
    p.add_argument(
        "--dashboard-port",
        type=int,
        default=DEFAULT_DASHBOARD_PORT,
        metavar="PORT",
        help=f"dashboard and metrics port on 127.0.0.1 (default {DEFAULT_DASHBOARD_PORT}; a free "
        "one when it is taken)",
    )
    p.add_argument(
        "--data-dir", type=Path, help="store and logs (default: ~/.local/state/arranger/dev)"
    )
    p.add_argument(
        "--demo",
        action="store_true",
        help="run the CartPole learner+actors job and exit with its result",
    )
    p.add_argument(
        "-v", "--verbose", action="store_true", help="show the server's and agents' logs"
    )
    p.set_defaults(handler=cmd_dev)


@dataclass(frozen=True)
class DevOptions:
    agents: int = 2
    fake_gpus: int = 0
    gpu_model: str = "FakeGPU"
    port: int = DEFAULT_PORT
    data_dir: Path | None = None
    dashboard_port: int = 0  # 0: any free port


def cmd_dev(args: argparse.Namespace) -> int:
    logsetup.configure("info" if args.verbose else "warning")
    if args.agents < 1:
        raise ValueError("--agents must be at least 1")
    options = DevOptions(
        args.agents,
        args.fake_gpus,
        args.gpu_model,
        args.port,
        args.data_dir,
        args.dashboard_port if _port_free(args.dashboard_port) else 0,
    )
    try:
        return asyncio.run(run_dev(options, demo=args.demo))
    except StoreError as exc:  # e.g. another arranger dev on the same data directory
        raise DevError(f"{exc} (pass another --data-dir)") from None


def dev_state_dir() -> Path:
    return state_dir() / "dev"


def dev_host_paths() -> tuple[str, ...]:
    """dev_host_paths: where a dev cluster's volumes may point: the developer's home and the
    temporary directory."""
    return tuple(dict.fromkeys((str(Path.home()), "/tmp", tempfile.gettempdir())))


class DevCluster:
    """DevCluster is a server plus agents on 127.0.0.1, started and stopped together. Its
    agents stop their pods as they stop (the cluster is all its own); a cluster started
    again over the same data directory runs them again without counting a restart."""

    def __init__(
        self,
        options: DevOptions,
        data_dir: Path,
        server_config: ServerConfig | None = None,
        capacity: Capacity | None = None,
    ) -> None:
        """`server_config` replaces the dev defaults (its listen address is kept on 127.0.0.1);
        `capacity` replaces what each agent discovers (tests use it for exact node sizes)."""
        self.options = options
        self.data_dir = data_dir
        self.capacity = capacity
        config = server_config or ServerConfig(
            heartbeat_interval_s=1.0,
            fence_timeout_s=20.0,
            controller=ControllerConfig(node_timeout_s=30.0, kill_grace_s=5.0),
        )
        config = dataclasses.replace(
            config,
            listen=f"127.0.0.1:{options.port}",
            data_dir=data_dir,
            init=True,
            http_listen=config.http_listen and f"127.0.0.1:{options.dashboard_port}",
            agent_secret=secrets.token_urlsafe(32),  # the agents' own, never written down
        )
        if not config.policy.allowed_host_paths:  # volumes from the developer's own files
            policy = dataclasses.replace(config.policy, allowed_host_paths=dev_host_paths())
            config = dataclasses.replace(config, policy=policy)
        self.server = ArrangerServer(config)
        self.agents: list[Agent] = []
        self.token = ""  # the owner's login, issued by start()
        self.login_file: Path | None = None  # where it is left for the owner's commands

    def metrics_urls(self) -> list[str]:
        """metrics_urls: the server's and each agent's HTTP port, where they serve one."""
        ports = [self.server.web.url, *(a.web.url for a in self.agents if a.web is not None)]
        return [url for url in ports if url]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    @property
    def dashboard_url(self) -> str:
        """dashboard_url: the dashboard, with the owner's login (for the owner's eyes only)."""
        return f"{self.server.web.url}/login?token={self.token}" if self.server.web.url else ""

    def serve_with(self, server: ArrangerServer) -> None:
        """serve_with makes `server` (made on this cluster's config) the cluster's, its
        owner's login granted: a server started again keeps the run's login."""
        server.tokens.grant(self.token, Principal(local_principal().user, Role.ADMIN))
        self.server = server

    async def start(self) -> None:
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # The owner's login lives in this server's memory only: no other run of it accepts it.
        self.token = new_token()
        self.serve_with(self.server)
        await self.server.start()
        self.login_file = write_login(self.address, self.token)
        interpreter_dir = str(Path(sys.executable).parent)
        for i in range(self.options.agents):
            name = f"dev-{i}"
            config = AgentConfig(
                server=self.address,
                node_name=name,
                address="127.0.0.1",
                data_dir=self.data_dir / "agents" / name,
                share=self.options.agents,
                fake_gpus=self.options.fake_gpus,
                fake_gpu_model=self.options.gpu_model,
                path_prepend=(interpreter_dir,),  # `python` in a job is this Python
                fence_timeout_s=self.server.config.fence_timeout_s,
                heartbeat_interval_s=self.server.config.heartbeat_interval_s,
                reconnect_max_s=1.0,  # the server is local: come back quickly
                limits=False,  # N agents share this machine: no memory or CPU limits (pids
                # limits and the GPU device filter hold, where dev runs as root)
                http_listen="127.0.0.1:0",  # each its own free port
                usage_interval_s=min(5.0, self.server.config.heartbeat_interval_s),
                stop_pods_on_exit=True,  # dev owns the whole cluster: Ctrl-C stops it all
                secret=self.server.config.agent_secret,
                # No user and no runAs: pods run as whoever started arranger dev (root too).
            )
            agent = Agent(config, self.capacity)
            agent.start()
            self.agents.append(agent)
        async with asyncio.timeout(30):
            await asyncio.gather(*(a.connected.wait() for a in self.agents))

    async def stop(self) -> None:
        await asyncio.gather(*(a.stop() for a in self.agents), return_exceptions=True)
        await self.server.stop()
        if self.token:
            forget_login(self.address, self.token)


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def run_dev(options: DevOptions, demo: bool = False) -> int:
    temp: str | None = None
    data_dir = options.data_dir
    if data_dir is None:
        if demo:
            temp = tempfile.mkdtemp(prefix="arranger-demo-")
            data_dir = Path(temp)
        else:
            data_dir = dev_state_dir()
    if not _port_free(options.port):
        if not demo:
            raise DevError(
                f"port {options.port} on 127.0.0.1 is in use (another arranger dev?); pass --port"
            )
        options = dataclasses.replace(options, port=0)
    cluster = DevCluster(options, data_dir)
    try:
        await cluster.start()
        nodes = len(cluster.agents)
        console.print(
            f"[bold]arranger dev[/]: server at {cluster.address}, {nodes} agents, data in {data_dir}"
            f"\ndashboard (logs this browser in as {escape(local_principal().user)}): "
            f"{cluster.dashboard_url}"
            "\nmetrics (Prometheus): "
            + " ".join(f"{url}/metrics" for url in cluster.metrics_urls()),
            soft_wrap=True,
        )
        if demo:
            return await run_demo(cluster)
        console.print(
            f"In other shells: export ARRANGER_SERVER={cluster.address}"
            f" (your login: {cluster.login_file})"
            "\nTry: arranger nodes   |   arranger submit examples/cartpole.yaml"
            "\nOnly you can use it: your commands find your login by themselves; other "
            "accounts on this machine are refused."
            "\nPress Ctrl-C to stop: running pods are stopped with it, and run again (no "
            "restart counted) when arranger dev starts over the same data directory.",
            soft_wrap=True,
        )
        await until_stop_signal()
        return 0
    finally:
        await cluster.stop()
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)


def demo_job() -> job_pb2.TYJob:
    """demo_job is the packaged CartPole job, run by the Python that runs arranger."""
    text = (resources.files("arranger.examples.cartpole") / "job.yaml").read_text()
    job = load_job_yaml(text, "cartpole demo")
    for template in [job.spec.leader.template, *(ws.template for ws in job.spec.worker_sets)]:
        if template.command and template.command[0] == "python":
            template.command[0] = sys.executable
    return job


async def run_demo(cluster: DevCluster) -> int:
    started = time.monotonic()

    def say(text: str) -> None:
        console.print(f"[dim]{time.monotonic() - started:6.1f}s[/] {text}")

    async with AsyncClient(cluster.address) as client:
        job = await client.submit(demo_job())
        name = job.metadata.name
        actors = [ws for ws in job.spec.worker_sets if not ws.auxiliary]
        helpers = sum(ws.counts for ws in job.spec.worker_sets if ws.auxiliary)
        counts = sum(ws.counts for ws in actors)
        most = sum(max(ws.counts, ws.max_counts) for ws in actors)
        say(
            f"submitted job [bold]{name}[/]: 1 learner + {counts} actors, up to {most}, "
            f"+ {helpers} evaluator (CartPole, policy gradient)"
        )
        logs: asyncio.Task[None] | None = None
        last_stage, last_running = "", 0
        try:
            async with asyncio.timeout(DEMO_TIMEOUT_S):
                async for event in client.watch(name):
                    progress = progress_of(event)
                    if progress is None:
                        continue
                    if progress.stage != last_stage:
                        last_stage = progress.stage
                        say(f"job {render.stage(progress.stage)}: {progress.message}")
                    running = progress.running_workers
                    if running != last_running and progress.stage in ("Starting", "Running"):
                        last_running = running
                        say(f"workers running: {running} (actors up to {most}, + evaluator)")
                    # The leader's pod is news when it starts; a watch that began later
                    # sees a Running job.
                    leader_runs = any(
                        p.role == "leader" and p.state == "Running" for p in event.pods
                    ) or (event.type == "ADDED" and progress.stage == "Running")
                    if logs is None and leader_runs:
                        logs = asyncio.create_task(_follow_learner(client, name, say))
                    if progress.stage in FINISHED:
                        break
        except TimeoutError:
            say(f"[bold red]the demo did not finish within {DEMO_TIMEOUT_S:.0f}s[/]")
            return 1
        finally:
            if logs is not None:
                with contextlib.suppress(TimeoutError, asyncio.CancelledError, ArrangerError):
                    await asyncio.wait_for(logs, 5)
        final = await client.get(name)
    ok = final.status.stage == "Succeeded"
    verdict = "[bold green]demo succeeded[/]" if ok else "[bold red]demo failed[/]"
    say(f"{verdict}: {final.status.reason}: {final.status.message}")
    return 0 if ok else 1


async def _follow_learner(client: AsyncClient, name: str, say: Callable[[str], None]) -> None:
    buffer = b""
    async for data in client.logs(name, follow=True):
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            say(f"[cyan]learner |[/] {line.decode(errors='replace')}")
