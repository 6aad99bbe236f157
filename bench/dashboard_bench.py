"""dashboard_bench: how long the dashboard's pages take with 1,000 jobs on 200 nodes.

Starts a real arranger-server process (insecure, its HTTP port on 127.0.0.1) and 200 simulated
agents (bench/swarm_agent.py: the real AgentService protocol, 8 GPUs each, no processes),
submits 1,000 jobs (1 leader + 3 workers; a quarter of the leaders ask for half a GPU), waits
until every one is Running, then fetches each page N times over HTTP (the server's answer,
measured at the client) and, where Chromium and its driver are installed, loads the cluster
and jobs pages in headless Chromium (navigation timing: request to load event). Prints one
JSON object.

    python bench/dashboard_bench.py [--jobs 1000] [--nodes 200] [--rounds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from swarm_procs import Swarm, free_port, stop_group  # bench/, run as a script

from arranger.client.sdk import AsyncClient
from arranger.server.config import load_server_config
from arranger.server.main import init_store

HERE = Path(__file__).resolve().parent


def job(index: int) -> dict[str, Any]:
    leader: dict[str, Any] = {"command": ["learn"], "resources": {"cpu": 1, "memory": "1Gi"}}
    if index % 4 == 0:
        leader["resources"]["gpu"] = 0.5
    return {
        "metadata": {"name": f"job-{index:05d}"},
        "spec": {
            "leader": {"name": "learner", "template": leader},
            "workerSets": [
                {
                    "name": "actors",
                    "counts": 3,
                    "template": {"command": ["act"], "resources": {"cpu": 1, "memory": "1Gi"}},
                }
            ],
        },
    }


def fetch(url: str) -> tuple[float, int]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as reply:
        size = len(reply.read())
    return time.perf_counter() - started, size


def timings(url: str, rounds: int) -> dict[str, float]:
    fetch(url)  # warm
    seconds, sizes = zip(*(fetch(url) for _ in range(rounds)), strict=True)
    ms = sorted(s * 1000 for s in seconds)
    return {
        "p50_ms": round(statistics.median(ms), 1),
        "max_ms": round(ms[-1], 1),
        "kib": round(sizes[0] / 1024, 1),
    }


def browser_loads(urls: dict[str, str], rounds: int) -> dict[str, Any]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        return {"skipped": "Chromium or chromedriver is not installed"}
    from selenium import webdriver  # noqa: PLC0415 (only where a browser is measured)

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    browser = webdriver.Chrome(options=options, service=webdriver.ChromeService(driver))
    try:
        loads = {}
        for name, url in urls.items():
            ms = []
            for _ in range(rounds):
                browser.get(url)
                ms.append(
                    browser.execute_script(
                        "const n = performance.getEntriesByType('navigation')[0];"
                        "return n.loadEventEnd - n.startTime;"
                    )
                )
            loads[name] = {"p50_ms": round(statistics.median(ms), 1), "max_ms": round(max(ms), 1)}
        return loads
    finally:
        browser.quit()


def start_server(root: Path, jobs: int) -> tuple[subprocess.Popen[bytes], str, int]:
    """start_server: an arranger-server process with a new store under `root`; its gRPC
    address and its HTTP port."""
    address, http = f"127.0.0.1:{free_port()}", free_port()
    config = root / "server.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listen": address,
                "dataDir": str(root / "store"),
                "insecure": True,
                "httpListen": f"127.0.0.1:{http}",
                "limits": {
                    "jobsPerUser": 10 * jobs,
                    "podsPerUser": 40 * jobs,
                    "submitBurst": 10 * jobs,
                },
            }
        )
    )
    asyncio.run(init_store(load_server_config(config)))
    command = [
        sys.executable,
        "-m",
        "arranger.server.main",
        "--config",
        str(config),
        "--log-level",
        "warning",
    ]
    with (root / "server.log").open("ab") as log:
        server = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
    return server, address, http


async def measure(args: argparse.Namespace, root: Path, address: str, http: int) -> dict[str, Any]:
    swarm = await Swarm.start(
        root, address, 0, args.nodes, argparse.Namespace(swarm_cpu=None, resync_s=30.0)
    )
    try:
        await swarm.event("ready", 60)
        await swarm.send(cmd="connect")
        await swarm.event("registered", 120)
        async with AsyncClient(address) as client:
            for index in range(args.jobs):
                await client.submit(job(index))
            deadline = time.monotonic() + 300
            while True:
                jobs = await client.jobs()
                running = sum(j.progress.stage == "Running" for j in jobs)
                if running == args.jobs or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
            some = jobs[len(jobs) // 2].id
        base = f"http://127.0.0.1:{http}"
        pages = {
            "cluster": f"{base}/",
            "jobs": f"{base}/jobs",
            "job": f"{base}/jobs/{some}",
            "queues": f"{base}/queues",
            "metrics": f"{base}/metrics",
        }
        served = {
            name: await asyncio.to_thread(timings, url, args.rounds) for name, url in pages.items()
        }
        loaded = await asyncio.to_thread(
            browser_loads, {"cluster": pages["cluster"], "jobs": pages["jobs"]}, 5
        )
        return {
            "jobs": args.jobs,
            "running": running,
            "nodes": args.nodes,
            "served": served,
            "browser": loaded,
        }
    finally:
        await swarm.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="arranger-dashboard-") as tmp:
        server, address, http = start_server(Path(tmp), args.jobs)
        try:
            result = asyncio.run(measure(args, Path(tmp), address, http))
        finally:
            stop_group(server)
    result["machine"] = f"{platform.node()} ({platform.processor() or platform.machine()})"
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
