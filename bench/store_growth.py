"""store_growth: what one user within the limits makes a real arranger-server hold, and what
parallel event listings cost another user.

Starts arranger-server as its own process (TLS, tokens, the default limits) on a store that
already holds 100,000 events, then:

1. listings: 12 parallel `ListEvents(limit=100000)` loops by mallory, as a client of v0.1.0
   sends it, while alice submits a parked job once a second: her submit latency, alone and
   during the loops (a submit is the API's busiest write; placing needs agents, which this
   script does not run);
2. growth: mallory submits parked jobs of a spec just under limits.specBytes (1 MiB) as fast
   as she is let for `--seconds`: the server's resident memory and the store's size on disk
   before and after, the jobs taken, and the refusal that stopped her.

    python bench/store_growth.py [--source DIR] [--seconds 40]

`--source` runs the server from another checkout (say `git archive v0.1.0`, unpacked), for a
before-and-after on the same machine; the client is this checkout's either way.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import yaml

from arranger.client.channel import make_channel
from arranger.client.sdk import ArrangerError, AsyncClient
from arranger.v1 import arranger_pb2, arranger_pb2_grpc

EVENTS = 100_000
LISTERS = 12


def parked(name: str, big: bool = False) -> dict[str, Any]:
    """parked: a job no node takes (its pods want a label no node has); `big`: as big as
    validation lets a spec under 1 MiB be (5 templates, each with 124 KiB of arguments and
    60 KiB of environment)."""
    template: dict[str, Any] = {
        "command": ["true"],
        "resources": {"cpu": 0.1, "memory": "64Mi"},
        "nodeSelector": {"pool": "none"},
    }
    if big:
        template.update(args=["x" * 124 * 1024], env={"BLOB": "y" * 60 * 1024})
    sets = [{"name": f"set{i}", "counts": 1, "template": template} for i in range(4 if big else 1)]
    return {
        "apiVersion": "arranger/v1",
        "kind": "TYJob",
        "metadata": {"name": name},
        "spec": {"leader": {"name": "learner", "template": template}, "workerSets": sets},
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_cli(*argv: str, source: Path | None = None) -> str:
    """run_cli: what `arranger ARGV` printed, run from `source` (None: this checkout)."""
    cwd = source or Path.cwd()
    done = subprocess.run(
        [sys.executable, "-c", CLI, *argv],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(cwd)},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"arranger {' '.join(argv)} failed: {done.stderr[-500:]}")
    return done.stdout


CLI = "import sys; from arranger.client.cli import main; sys.exit(main(sys.argv[1:]))"


@contextlib.contextmanager
def server(tmp: Path, source: Path | None) -> Iterator[tuple[str, int]]:
    """server: arranger-server's address and pid, on a new store holding EVENTS events."""
    tls, data = tmp / "tls", tmp / "data"
    run_cli("certs", "--out", str(tls), "--server-host", "127.0.0.1", "--agent", "n1")
    settings = {
        "listen": f"127.0.0.1:{free_port()}",
        "agentListen": f"127.0.0.1:{free_port()}",
        "dataDir": str(data),
        "httpListen": "",
        "tls": {
            "ca": str(tls / "ca.pem"),
            "cert": str(tls / "server.pem"),
            "key": str(tls / "server.key"),
        },
    }
    config = tmp / "server.yaml"
    config.write_text(yaml.safe_dump(settings))
    env, cwd = dict(os.environ), source or Path.cwd()  # `python -m` imports from its cwd first
    env["PYTHONPATH"] = str(cwd)
    argv = [sys.executable, "-m", "arranger.server.main", "--config", str(config)]
    subprocess.run([*argv, "--init"], check=True, capture_output=True, env=env, cwd=cwd)
    with sqlite3.connect(data / "arranger.db") as db:  # the server is not running yet
        now = time.time()  # recent: retention keeps them
        rows = [
            (now - EVENTS + i, "Test", "", "", "", f"event {i} " + "x" * 80) for i in range(EVENTS)
        ]
        db.executemany(
            "INSERT INTO events (time, kind, job_id, job_name, pod, message) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            rows,
        )
    with (tmp / "server.log").open("wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd=cwd
        )
    try:
        yield str(settings["listen"]), proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def store_mb(data: Path) -> float:
    return round(sum(p.stat().st_size for p in data.glob("arranger.db*")) / 2**20, 1)


async def up(address: str, ca: Path, token: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(ArrangerError):
            async with AsyncClient(address, ca=ca, token=token, timeout_s=2) as c:
                await c.queues()
                return
        await asyncio.sleep(0.1)
    raise SystemExit("the server did not come up")


async def submit_latencies(client: AsyncClient, prefix: str, count: int) -> list[float]:
    taken = []
    for i in range(count):
        started = time.perf_counter()
        await client.submit(parked(f"{prefix}-{i}"), queue_anyway=True)
        taken.append(time.perf_counter() - started)
        await client.delete(f"{prefix}-{i}")
        await asyncio.sleep(0.5)
    return taken


async def listings(address: str, ca: Path, tokens: dict[str, str]) -> dict[str, Any]:
    async with AsyncClient(address, ca=ca, token=tokens["alice"], timeout_s=60) as alice:
        alone = await submit_latencies(alice, "alone", 8)
        stop = asyncio.Event()
        counts = {"pages": 0, "events": 0, "refused": 0}
        refusal = ""

        async def lister() -> None:
            nonlocal refusal
            channel = make_channel(address, tokens["mallory"], ca)
            async with channel:
                stub = arranger_pb2_grpc.ArrangerStub(channel)
                while not stop.is_set():
                    try:
                        request = arranger_pb2.ListEventsRequest(limit=EVENTS)
                        reply = await stub.ListEvents(request, timeout=60)
                    except grpc.aio.AioRpcError as exc:
                        counts["refused"] += 1
                        refusal = refusal or f"{exc.code().name}: {exc.details()}"
                        await asyncio.sleep(0.05)
                        continue
                    counts["pages"] += 1
                    counts["events"] += len(reply.events)

        tasks = [asyncio.create_task(lister()) for _ in range(LISTERS)]
        await asyncio.sleep(1.0)
        during = await submit_latencies(alice, "during", 8)
        stop.set()
        await asyncio.gather(*tasks)
    return {
        "alice_submit_s_alone": summary(alone),
        "alice_submit_s_during": summary(during),
        "mallory": {**counts, "first_refusal": refusal[:200]},
    }


async def growth(
    address: str, ca: Path, token: str, pid: int, data: Path, seconds: float
) -> dict[str, Any]:
    before = {"rss_mb": rss_mb(pid), "store_mb": store_mb(data)}
    taken, refusal = 0, ""
    deadline = time.monotonic() + seconds
    async with AsyncClient(address, ca=ca, token=token, timeout_s=60) as mallory:

        async def submitter(lane: int) -> None:
            nonlocal taken, refusal
            i = 0
            while time.monotonic() < deadline:
                try:
                    await mallory.submit(parked(f"big-{lane}-{i}", big=True), queue_anyway=True)
                    taken += 1
                except ArrangerError as exc:
                    refusal = refusal or f"{exc.code.name}: {exc.message}"
                    await asyncio.sleep(0.05)
                i += 1

        await asyncio.gather(*(submitter(lane) for lane in range(4)))
    await asyncio.sleep(2.0)  # the last writes land
    after = {"rss_mb": rss_mb(pid), "store_mb": store_mb(data)}
    return {
        "seconds": seconds,
        "jobs_taken": taken,
        "before": before,
        "after": after,
        "first_refusal": refusal[:300],
    }


def summary(values: list[float]) -> dict[str, float]:
    return {"p50": round(statistics.median(values), 3), "max": round(max(values), 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=None)
    parser.add_argument("--seconds", type=float, default=40.0)
    args = parser.parse_args()
    result: dict[str, Any] = {"server_source": str(args.source or "this checkout")}
    with tempfile.TemporaryDirectory(prefix="arranger-growth-") as name:
        tmp = Path(name)
        with server(tmp, args.source) as (address, pid):
            data, ca = tmp / "data", tmp / "tls" / "ca.pem"
            tokens = {
                user: run_cli(
                    "token",
                    "create",
                    "--user",
                    user,
                    "--data-dir",
                    str(data),
                    user,
                    source=args.source,
                )
                .strip()
                .splitlines()[-1]
                for user in ("alice", "mallory")
            }
            asyncio.run(up(address, ca, tokens["alice"]))
            result["listings"] = asyncio.run(listings(address, ca, tokens))
            result["growth"] = asyncio.run(
                growth(address, ca, tokens["mallory"], pid, data, args.seconds)
            )
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
