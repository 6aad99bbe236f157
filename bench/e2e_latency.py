"""e2e_latency: how fast a submitted gang becomes running processes, end to end.

Starts arranger-server and 4 arranger-agent processes on 127.0.0.1 (each its own process, as
in a real deployment), then:
- submits jobs of 1 leader + 16 workers (each `python -c` that sleeps), one after another, and
  measures from submit until the agents confirm all 17 processes exist;
- submits 50 jobs of 1 + 3 at once and measures until all 200 processes run.
Prints one JSON line: p50_ms, p95_ms, gangs_per_s and what was measured. With `--image`, every
pod runs `sleep 600` in a podman container of that image (one with a `sleep`, such as the
busybox image README's Containers section builds).

    python bench/e2e_latency.py [--jobs 20] [--binary | --image localhost/busybox:1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from arranger.client.sdk import AsyncClient, progress_of

PYTHON_SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
BINARY_SLEEPER = ["sleep", "600"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def job(name: str, workers: int, command: list[str], image: str = "") -> dict[str, object]:
    template: dict[str, object] = {
        "command": command,
        "resources": {"cpu": "10m", "memory": "16Mi"},
    }
    if image:
        template["image"] = image
    return {
        "metadata": {"name": name},
        "spec": {
            "minWorkersNum": workers,
            "leader": {"name": "learner", "template": template},
            "workerSets": [{"name": "actors", "counts": workers, "template": template}],
        },
    }


class Cluster:
    """Cluster runs the daemons as separate processes, each in its own process group."""

    def __init__(self, root: Path, agents: int) -> None:
        self.root = root
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.agents = agents
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        bin_dir = Path(sys.executable).parent
        log = open(self.root / "daemons.log", "ab")  # noqa: SIM115 (closed with the processes)
        server = [str(bin_dir / "arranger-server"), "--listen", self.address,
                  "--data-dir", str(self.root / "server"), "--insecure"]  # fmt: skip
        subprocess.run([*server, "--init"], check=True, capture_output=True)  # a new cluster
        self.procs.append(
            subprocess.Popen(
                [*server, "--log-level", "warning"],
                stdout=log, stderr=log, start_new_session=True,
            )
        )  # fmt: skip
        for i in range(self.agents):
            self.procs.append(
                subprocess.Popen(
                    [str(bin_dir / "arranger-agent"), "--server", self.address, "--node-name", f"bench-{i}",
                     "--address", "127.0.0.1", "--data-dir", str(self.root / f"agent-{i}"), "--run-as-root",
                     "--log-level", "warning"],
                    stdout=log, stderr=log, start_new_session=True,
                )
            )  # fmt: skip

    def stop(self) -> None:
        for proc in reversed(self.procs):  # agents first: they stop their pods
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


async def wait_nodes(client: AsyncClient, count: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            nodes = await client.nodes()
            if sum(1 for n in nodes if n.state == "Ready") == count:
                return
        except Exception:  # the server may still be starting
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{count} agents did not join within 30 s")


async def until_running(client: AsyncClient, names: set[str], processes: int) -> None:
    """until_running returns once the jobs' leaders and workers all run (agent-confirmed)."""
    workers: dict[str, int] = {}
    leaders: dict[str, bool] = {}
    async for event in client.watch(""):
        if event.name not in names:
            continue
        progress = progress_of(event)
        if progress is not None:
            workers[event.name] = progress.running_workers
        for pod in event.pods:
            if pod.role == "leader":
                leaders[event.name] = pod.state == "Running"
        if sum(workers.values()) + sum(leaders.values()) >= processes:
            return


async def measure(address: str, jobs: int, command: list[str], image: str) -> dict[str, object]:
    async with AsyncClient(address) as client:
        await wait_nodes(client, 4)
        latencies = []
        for i in range(jobs):
            name = f"lat-{i}"
            watcher = asyncio.create_task(until_running(client, {name}, 17))
            await asyncio.sleep(0.05)  # the watch is subscribed before the submit
            started = time.perf_counter()
            await client.submit(job(name, 16, command, image))
            await asyncio.wait_for(watcher, 60)
            latencies.append((time.perf_counter() - started) * 1000)
            await client.delete(name)
        names = {f"gang-{i}" for i in range(50)}
        watcher = asyncio.create_task(until_running(client, names, 200))
        await asyncio.sleep(0.05)
        started = time.perf_counter()
        await asyncio.gather(
            *(client.submit(job(name, 3, command, image)) for name in sorted(names))
        )
        await asyncio.wait_for(watcher, 120)
        gang_s = time.perf_counter() - started
        for name in names:
            await client.delete(name)
    latencies.sort()
    return {
        "p50_ms": round(statistics.median(latencies), 1),
        "p95_ms": round(latencies[max(0, round(0.95 * len(latencies)) - 1)], 1),
        "max_ms": round(latencies[-1], 1),
        "jobs": jobs,
        "pods_per_job": 17,
        "gangs_per_s": round(50 / gang_s, 1),
        "gangs_seconds": round(gang_s, 3),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument(
        "--binary", action="store_true",
        help="run /bin/sleep instead of python: the scheduler's own share, without Python start-up",
    )  # fmt: skip
    parser.add_argument("--image", default="", help="run `sleep 600` in containers of this image")
    args = parser.parse_args()
    command = BINARY_SLEEPER if args.binary or args.image else PYTHON_SLEEPER
    with tempfile.TemporaryDirectory(prefix="arranger-bench-") as tmp:
        cluster = Cluster(Path(tmp), agents=4)
        cluster.start()
        try:
            result = asyncio.run(measure(cluster.address, args.jobs, command, args.image))
            result["command"] = " ".join(command) + (f" in {args.image}" if args.image else "")
        finally:
            cluster.stop()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
