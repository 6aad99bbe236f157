"""experiment_bench: a 1,000-member experiment, submitted, read and listed on a real server,
and what it costs other users' placement.

Part one: a real server (SQLite in a temporary directory, no agents: nothing runs) on
127.0.0.1, `jobsPerUser` raised to 5,000. One experiment of 1,000 members (10 points x 100
seeds, 1 leader + 1 worker each, maxParallel 50) is submitted over gRPC and timed (wall, and
the CPU of this process, which holds server and client), then GetExperiment, a folded
ListJobs, and `arranger list` (a real CLI process: folded, as a user runs it) are timed.

Part two: the scheduling core as the server runs it (the controller's kept snapshot, then
run_cycle) on 200 nodes while another user submits a job each cycle: the CPU of a cycle with
no experiment, with the 1,000-member experiment held to maxParallel 50 (950 members held out
of scheduling), and with no maxParallel (every member placed by the first cycle: 1,000 more
jobs in every later cycle's input).

    python bench/experiment_bench.py [--members 1000] [--rounds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from arranger.client.sdk import AsyncClient
from arranger.client.specfile import load_job_data, load_job_yaml
from arranger.logsetup import configure
from arranger.sched import SchedulerConfig, run_cycle
from arranger.server.app import ArrangerServer
from arranger.server.config import ServerConfig
from arranger.server.controller import Controller
from arranger.server.convert import spec_to_json
from arranger.server.limits import UserLimits
from arranger.server.model import ExperimentRecord, GpuRecord
from arranger.server.nodes import NodeRegistration
from arranger.server.snapshot import SchedulingState
from arranger.server.validation import parse_job
from arranger.sweep import Members
from arranger.v1 import arranger_pb2

GI = 2**30
OTHER = """
metadata: {{name: other-{n}}}
spec:
  leader: {{name: l, template: {{command: [l], resources: {{cpu: "8", gpu: "1"}}}}}}
  workerSets: [{{name: w, counts: 3, template: {{command: [w], resources: {{cpu: "4"}}}}}}]
"""


def sweep_doc(members: int, max_parallel: int, cpu: str = "100m") -> dict[str, object]:
    points = 10
    return {
        "metadata": {"name": "big"},
        "spec": {
            "sweep": {
                "parameters": {"lr": [f"{i}e-4" for i in range(points)]},
                "seeds": members // points,
                "maxParallel": max_parallel,
            },
            "leader": {
                "name": "learner",
                "template": {
                    "command": ["python", "train.py", "--lr={lr}", "--seed={seed}"],
                    "resources": {"cpu": cpu, "memory": "64Mi"},
                },
            },
            "workerSets": [
                {
                    "name": "actors",
                    "template": {
                        "command": ["python", "act.py"],
                        "resources": {"cpu": cpu, "memory": "64Mi"},
                    },
                }
            ],
        },
    }


async def on_a_server(members: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        config = ServerConfig(
            listen="127.0.0.1:0",
            data_dir=Path(tmp),
            init=True,
            http_listen="",
            limits=UserLimits(jobs_per_user=5_000, pods_per_user=50_000),
        )
        server = ArrangerServer(config)
        await server.start()
        try:
            address = f"127.0.0.1:{server.port}"
            async with AsyncClient(address, timeout_s=60) as client:
                stub = client._stubs[0]
                job = load_job_data(sweep_doc(members, 50))
                cpu, wall = time.process_time(), time.perf_counter()
                reply = await stub.SubmitJob(
                    arranger_pb2.SubmitJobRequest(job=job, queue_anyway=True)
                )
                submit_s, submit_cpu = time.perf_counter() - wall, time.process_time() - cpu
                assert reply.experiment.members == members
                wall = time.perf_counter()
                exp = await stub.GetExperiment(arranger_pb2.GetExperimentRequest(name="big"))
                get_s = time.perf_counter() - wall
                assert len(exp.members) == members
                wall = time.perf_counter()
                folded = await stub.ListJobs(arranger_pb2.ListJobsRequest(fold=True))
                fold_s = time.perf_counter() - wall
                assert [e.members for e in folded.experiments] == [members]
                cli = []
                for _ in range(5):  # the server runs on this event loop: the CLI must not block it
                    wall = time.perf_counter()
                    ran = await asyncio.create_subprocess_exec(
                        sys.executable,
                        "-m",
                        "arranger.client.cli",
                        "--server",
                        address,
                        "list",
                        stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.PIPE,
                    )
                    out, err = await ran.communicate()
                    assert ran.returncode == 0, err.decode()
                    cli.append(time.perf_counter() - wall)
                lines = out.decode().strip().splitlines()
        finally:
            await server.stop()
    return {
        "members": members,
        "submit_s": round(submit_s, 3),
        "submit_cpu_s": round(submit_cpu, 3),
        "get_experiment_s": round(get_s, 3),
        "list_folded_rpc_s": round(fold_s, 4),
        "cli_list_s_median": round(statistics.median(cli), 3),
        "cli_list_s_min_max": [round(min(cli), 3), round(max(cli), 3)],
        "cli_list_lines": len(lines),
    }


def cycles(members: int, max_parallel: int | None, rounds: int) -> dict[str, float]:
    """cycles: CPU ms of a cycle (kept snapshot, then the core) while another user submits
    one job a cycle, with the experiment (None: without)."""
    c = Controller()
    state = SchedulingState(c, [SchedulerConfig().machine_group_label])
    now = 1000.0
    for i in range(200):
        gpus = tuple(GpuRecord(g, f"GPU-{i}-{g}", "A100", 80 * GI) for g in range(8))
        reg = NodeRegistration(f"node-{i:04d}", "127.0.0.1", 64_000, 512 * GI, gpus=gpus)
        state.changed(c.node_registered(reg, now))
    if max_parallel is not None:
        spec = parse_job(load_job_data(sweep_doc(members, max_parallel, cpu="1")))
        make = Members(spec)
        specs = [
            (f"m{i:05d}", s, spec_to_json(s)) for i in range(members) for s in [make.spec_of(i)]
        ]
        exp = ExperimentRecord("exp", spec, spec_to_json(spec), now, "alice")
        state.changed(c.submit_experiment(exp, specs, now))
        state.changed(c.apply_plan(run_cycle(state.snapshot(now)), now))  # places what may run
        now += 1.0
    other = parse_job(load_job_yaml(OTHER.format(n=0)))
    text = spec_to_json(other)
    spent = []
    for n in range(rounds):
        _, fx = c.submit(
            f"o{n:05d}", dataclasses.replace(other, name=f"other-{n}"), text, now, "bob"
        )
        state.changed(fx)
        started = time.process_time()
        plan = run_cycle(state.snapshot(now))
        spent.append(time.process_time() - started)
        state.changed(c.apply_plan(plan, now))
        assert any(p.job_id == f"o{n:05d}" for p in plan.placements), "bob's job was placed"
        now += 1.0
    return {
        "median_ms": round(statistics.median(spent) * 1000, 2),
        "max_ms": round(max(spent) * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    configure("warning")
    result: dict[str, object] = asyncio.run(on_a_server(args.members))
    result["cycle_without"] = cycles(args.members, None, args.rounds)
    result["cycle_with_max_parallel_50"] = cycles(args.members, 50, args.rounds)
    result["cycle_with_every_member_placed"] = cycles(args.members, 0, args.rounds)
    result["machine"] = (
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
