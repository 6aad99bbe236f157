"""working_dir: how long shipping a job's working directory takes, the first time and again.

Starts arranger-server as a process of its own (SQLite store, or --store URL) and one agent in
this process, makes a working directory of --mib MiB of random (incompressible) bytes in
files of a MiB, and submits a job of two pods (leader and one worker, both on the agent) that
runs from it, twice. For each submit it measures, on the client: packing, then asking the
server whether it holds the package and uploading it if not; on the agent: fetching the
package from the server (once per node: the second submit finds it cached), and readying
each pod's copy (`agent_pod_copy_s`: waiting for the package, fetched or cached, then
unpacking it as the pod's account; see arranger.agent.packages; the worker starts once the
leader runs, which may already have ended, and a pod of the first job may land in the
second's list); and from submit until the job has Succeeded. Prints one JSON line.

    python bench/working_dir.py [--mib 50] [--store postgresql://...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml

from arranger.agent.agent import Agent
from arranger.agent.config import AgentConfig
from arranger.agent.discovery import Capacity
from arranger.client.package import chunks, pack
from arranger.client.sdk import AsyncClient

NODE = Capacity(cpu_milli=4000, memory_bytes=8 * 2**30)


def make_tree(top: Path, mib: int) -> None:
    (top / "train.py").write_text("import os\nassert os.path.exists('data/0.bin')\n")
    (top / "data").mkdir()
    for i in range(mib):
        (top / "data" / f"{i}.bin").write_bytes(os.urandom(2**20))


def job(name: str, sha256: str, size: int) -> dict[str, Any]:
    template = {
        "command": [sys.executable, "train.py"],
        "resources": {"cpu": 0.1, "memory": "64Mi"},
    }
    return {
        "apiVersion": "arranger/v1",
        "kind": "TYJob",
        "metadata": {"name": name},
        "spec": {
            "restartLimit": 0,
            "package": {"sha256": sha256, "size": size},
            "leader": {"name": "learner", "template": template},
            "workerSets": [{"name": "actors", "counts": 1, "template": template}],
        },
    }


def timed(calls: list[float], fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def wrapper(*args: Any) -> Any:
        started = time.perf_counter()
        try:
            return await fn(*args)
        finally:
            calls.append(time.perf_counter() - started)

    return wrapper


async def wait_serving(address: str, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while True:
        try:
            async with AsyncClient(address, timeout_s=2) as client:
                await client.nodes()
                return
        except Exception:
            if time.monotonic() > end:
                raise
            await asyncio.sleep(0.1)


async def run(args: argparse.Namespace, top: Path) -> dict[str, Any]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    address = f"127.0.0.1:{port}"
    settings: dict[str, Any] = {
        "listen": address,
        "dataDir": str(top / "server"),
        "insecure": True,
        "schedulePeriodSeconds": 0.2,
        "heartbeatIntervalSeconds": 0.5,
    }
    if args.store:
        settings["store"] = args.store
    config = top / "server.yaml"
    config.write_text(yaml.safe_dump(settings))
    command = [sys.executable, "-m", "arranger.server.main", "--config", str(config)]
    init = await asyncio.create_subprocess_exec(
        *command, "--init", stdout=asyncio.subprocess.DEVNULL
    )
    if await init.wait() != 0:
        raise SystemExit("arranger-server --init failed")
    with (top / "server.log").open("wb") as log:
        server = await asyncio.create_subprocess_exec(*command, stdout=log, stderr=log)
    agent: Agent | None = None
    try:
        await wait_serving(address, 30)
        agent = Agent(
            AgentConfig(
                server=address,
                node_name="bench-0",
                address="127.0.0.1",
                data_dir=top / "agent",
                path_prepend=(str(Path(sys.executable).parent),),
                stop_pods_on_exit=True,
                limits=False,
                podman="",
            ),
            NODE,
        )
        agent.start()
        cache = agent.supervisor.packages
        assert cache is not None
        fetches: list[float] = []
        unpacks: list[float] = []
        cache._download = timed(fetches, cache._download)  # type: ignore[method-assign]
        cache.unpack_into = timed(unpacks, cache.unpack_into)  # type: ignore[method-assign]
        tree = top / "proj"
        tree.mkdir()
        make_tree(tree, args.mib)
        runs = []
        async with AsyncClient(address, timeout_s=60) as client:
            await asyncio.wait_for(agent.connected.wait(), 30)
            for attempt in ("first", "second"):
                fetches.clear()
                unpacks.clear()
                started = time.perf_counter()
                packed = await asyncio.to_thread(pack, tree, top)
                packed_at = time.perf_counter()
                have = await client.has_package(packed.sha256)
                uploaded = False
                if not have.present:
                    sent = await client.upload_package(lambda packed=packed: chunks(packed))  # type: ignore[misc]
                    uploaded = sent.stored
                shipped_at = time.perf_counter()
                packed.path.unlink()
                name = f"wd-{attempt}"
                await client.submit(job(name, packed.sha256, packed.size))
                done = await client.wait(name, timeout_s=300)
                finished_at = time.perf_counter()
                assert done.status.stage == "Succeeded", done.status
                runs.append(
                    {
                        "run": attempt,
                        "packed_mib": round(packed.size / 2**20, 2),
                        "pack_s": round(packed_at - started, 3),
                        "has_and_upload_s": round(shipped_at - packed_at, 3),
                        "uploaded": uploaded,
                        "agent_fetch_s": [round(s, 3) for s in fetches],
                        "agent_pod_copy_s": sorted(round(s, 3) for s in unpacks),
                        "submit_to_succeeded_s": round(finished_at - shipped_at, 3),
                    }
                )
    finally:
        if agent is not None:
            await agent.stop()
        server.terminate()
        await asyncio.wait_for(server.wait(), 30)
    return {
        "bench": "working_dir",
        "mib": args.mib,
        "store": "postgresql" if args.store else "sqlite",
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=50, help="MiB of random files to ship")
    parser.add_argument("--store", default="", help="a postgresql:// URL (default: SQLite)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="arranger-bench-") as top:
        print(json.dumps(asyncio.run(run(args, Path(top)))))


if __name__ == "__main__":
    main()
