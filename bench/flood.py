"""flood: 2,000 submits from 20 concurrent clients against a real arranger-server process.

Every client has its own gRPC channel and submits its share of jobs back to back. The jobs are
parked (their leader asks for a node label no node has), so the measurement is the API and the
store, not the machine running processes. Afterwards every acknowledged job must be stored,
each with all its pods. Prints one JSON object: submits per second, latency percentiles, and
whether every acknowledged job was found.

    python bench/flood.py [--jobs 2000] [--clients 20]
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

import yaml

from arranger.client.sdk import ArrangerError, AsyncClient


def parked(name: str) -> dict[str, object]:
    template = {
        "command": ["true"],
        "resources": {"cpu": 0.1, "memory": "64Mi"},
        "nodeSelector": {"pool": "none"},
    }
    return {
        "apiVersion": "arranger/v1",
        "kind": "TYJob",
        "metadata": {"name": name},
        "spec": {
            "leader": {"name": "learner", "template": template},
            "workerSets": [{"name": "actors", "counts": 4, "template": template}],
        },
    }


async def serving(address: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            async with AsyncClient(address, timeout_s=1) as client:
                await client.jobs()
                return
        except ArrangerError:
            await asyncio.sleep(0.05)
    raise SystemExit(f"arranger-server at {address} did not come up")


async def flood(address: str, jobs: int, clients: int) -> dict[str, object]:
    latencies: list[float] = []
    acknowledged: list[str] = []
    refused: list[str] = []

    async def client_loop(index: int) -> None:
        async with AsyncClient(address, timeout_s=60) as client:
            for n in range(index, jobs, clients):
                name = f"flood-{n}"
                started = time.perf_counter()
                try:
                    await client.submit(parked(name), queue_anyway=True)
                except ArrangerError as exc:
                    refused.append(f"{name}: {exc.code.name} {exc.message}")
                    continue
                latencies.append(time.perf_counter() - started)
                acknowledged.append(name)

    started = time.perf_counter()
    await asyncio.gather(*(client_loop(i) for i in range(clients)))
    seconds = time.perf_counter() - started
    async with AsyncClient(address, timeout_s=60) as client:
        stored = {j.name: j for j in await client.jobs()}
    missing = [n for n in acknowledged if n not in stored]
    incomplete = [n for n in acknowledged if n in stored and stored[n].workers != 4]
    ordered = sorted(latencies)
    return {
        "jobs": jobs,
        "clients": clients,
        "acknowledged": len(acknowledged),
        "refused": len(refused),
        "refusals": refused[:5],
        "stored": len(stored),
        "acknowledged_missing": len(missing),
        "acknowledged_incomplete": len(incomplete),
        "seconds": round(seconds, 2),
        "submits_per_s": round(len(acknowledged) / seconds, 1),
        "p50_ms": round(1000 * statistics.median(ordered), 1) if ordered else None,
        "p99_ms": round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 1) if ordered else None,
        "machine": f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="arranger-flood-") as tmp:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        address = f"127.0.0.1:{port}"
        config = Path(tmp) / "server.yaml"
        settings = {
            "listen": address,
            "dataDir": f"{tmp}/store",
            "insecure": True,
            "httpListen": "",
        }
        config.write_text(yaml.safe_dump(settings))
        init = [sys.executable, "-m", "arranger.server.main", "--config", str(config), "--init"]
        subprocess.run(init, check=True, capture_output=True)  # a new cluster's store
        with (Path(tmp) / "server.log").open("wb") as log:
            server = subprocess.Popen(
                [sys.executable, "-m", "arranger.server.main", "--config", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            asyncio.run(serving(address, time.monotonic() + 30))
            result = asyncio.run(flood(address, args.jobs, args.clients))
            result["server_alive"] = server.poll() is None
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
    print(json.dumps(result))
    ok = result["acknowledged_missing"] == 0 and result["acknowledged_incomplete"] == 0
    return 0 if ok and result["server_alive"] else 1


if __name__ == "__main__":
    sys.exit(main())
