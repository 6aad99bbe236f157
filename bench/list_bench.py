"""list_bench: listing and watching 100,000 jobs on a real server over gRPC, and what a page costs.

The jobs (1 leader + 1 worker, finished, owned by three users in turn) are submitted through
the server's controller before it starts, as the API would have; the server then serves them
on 127.0.0.1 with no agents and no scheduling cycles. Measured: the server's time for one
page of 500 at the start, middle and end of the listing, against the algorithm ListJobs used
before (sort every job per page, find the token by a scan, whole TYJobs); listing everything
through the SDK (pages of 500 and of 5000) and `arranger list` (table and -o json); one
owner's jobs; a watch's initial listing up to SYNCED, against listing every page and then
watching from the first page's resume token; and the bytes of a summary against a whole job. Prints one JSON object.

    python bench/list_bench.py [--jobs 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from arranger.client.sdk import AsyncClient, as_job
from arranger.server.app import ArrangerServer
from arranger.server.config import ServerConfig
from arranger.server.controller import Controller
from arranger.server.convert import job_summary, job_to_proto, spec_to_json
from arranger.server.model import JobRecord
from arranger.server.validation import parse_job
from arranger.states import PodState, Stage
from arranger.v1 import arranger_pb2, arranger_pb2_grpc

OWNERS = ("alice", "bob", "carol")
PAGE = 500


MARKER = {
    "metadata": {"name": "marker"},
    "spec": {
        "leader": {"name": "learner", "template": {"command": ["true"]}},
        "workerSets": [{"name": "actors", "template": {"command": ["true"]}}],
    },
}


def fill(controller: Controller, count: int) -> None:
    spec = parse_job(
        as_job(
            {
                "metadata": {"name": "base"},
                "spec": {
                    "leader": {"name": "learner", "template": {"command": ["python", "learn.py"]}},
                    "workerSets": [
                        {"name": "actors", "template": {"command": ["python", "act.py"]}}
                    ],
                },
            }
        )
    )
    text = spec_to_json(spec)
    for i in range(count):
        named = dataclasses.replace(spec, name=f"job-{i:06d}")
        job, _ = controller.submit(f"{i:012x}", named, text, 1.7e9 + i, OWNERS[i % 3])
        job.stage = Stage.SUCCEEDED
        for pod in job.pods.values():
            pod.state, pod.done = PodState.SUCCEEDED, True


def old_page(controller: Controller, token: str) -> list[Any]:
    """old_page: one page as ListJobs made it before summaries (kept here to compare)."""
    jobs = sorted(
        (j for j in controller.jobs.values() if not j.deleted),
        key=lambda j: (j.submit_time, j.id),
    )

    def key(j: JobRecord) -> str:
        return f"{j.submit_time!r}/{j.id}"

    start = next((i + 1 for i, j in enumerate(jobs) if key(j) == token), 0) if token else 0
    return [job_to_proto(j) for j in jobs[start : start + PAGE]]


async def timed(call: Callable[[], Awaitable[Any]], runs: int = 1) -> float:
    """timed: the median seconds of `runs` calls."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        await call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def cli(address: str, *args: str) -> float:
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "arranger.client.cli",
        "--server",
        address,
        *args,
        stdout=asyncio.subprocess.DEVNULL,
    )
    if await proc.wait() != 0:
        raise SystemExit(f"arranger {' '.join(args)} failed")
    return time.perf_counter() - started


async def measure(count: int, data: Path) -> dict[str, object]:
    config = ServerConfig(
        listen="127.0.0.1:0", data_dir=data, schedule_period_s=3600.0, http_listen=""
    )
    server = ArrangerServer(config)
    started = time.perf_counter()
    fill(server.controller, count)
    fill_s = time.perf_counter() - started
    await server.start()
    address = f"127.0.0.1:{server.port}"
    result: dict[str, object] = {"jobs": count, "fill_s": round(fill_s, 1)}
    try:
        await asyncio.sleep(1)  # the first scheduling cycle after start
        order = list(server.controller.order.after(None))
        tokens = {
            "first": "",
            "middle": f"{server.controller.jobs[order[count // 2]].submit_time!r}/{order[count // 2]}",
            "last": f"{server.controller.jobs[order[-PAGE - 1]].submit_time!r}/{order[-PAGE - 1]}",
        }
        async with (
            AsyncClient(address, timeout_s=120) as client,
            grpc.aio.insecure_channel(address) as channel,
        ):
            stub = arranger_pb2_grpc.ArrangerStub(channel)
            for where, token in tokens.items():
                request = arranger_pb2.ListJobsRequest(page_size=PAGE, page_token=token)
                seconds = await timed(functools.partial(stub.ListJobs, request), runs=5)
                result[f"page_{where}_ms"] = round(seconds * 1000, 1)

            async def before() -> None:
                old_page(server.controller, tokens["middle"])

            result["old_page_middle_ms"] = round(await timed(before, runs=3) * 1000, 1)

            async def everything(size: int) -> None:
                n = sum([1 async for _ in client.iter_jobs(page_size=size)])
                assert n == count, n

            for size in (PAGE, 5000):
                seconds = await timed(functools.partial(everything, size))
                result[f"sdk_all_pages_of_{size}_s"] = round(seconds, 2)
            result["sdk_one_owner_s"] = round(await timed(lambda: client.jobs(owner="bob")), 2)

            async def synced() -> None:
                async for event in client.watch():
                    if event.type == "SYNCED":
                        return

            result["watch_until_synced_s"] = round(await timed(synced), 2)

            async def list_then_watch() -> None:
                jobs, token = await client.jobs_to_watch()
                assert len(jobs) == count
                await client.submit(MARKER)
                async for _ in client.watch(resume_token=token):
                    break  # the first change since the listing: the marker's ADDED

            result["list_then_watch_s"] = round(await timed(list_then_watch), 2)
        result["cli_list_table_s"] = round(await cli(address, "list", "--all"), 2)
        result["cli_list_json_s"] = round(await cli(address, "list", "--all", "-o", "json"), 2)
        result["cli_list_one_owner_s"] = round(
            await cli(address, "list", "--all", "--user", "bob"), 2
        )
        job = server.controller.jobs[order[0]]
        result["summary_bytes"] = job_summary(job).ByteSize()
        result["whole_job_bytes"] = job_to_proto(job).ByteSize()
    finally:
        await server.stop()
    result["machine"] = (
        f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="arranger-list-") as tmp:
        result = asyncio.run(measure(args.jobs, Path(tmp)))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
