"""sched_core: placement speed of the pure scheduling core (no server, no I/O).

Builds a snapshot of N empty nodes (32 cores, 256 GiB, 8 GPUs) and gang jobs (1 leader +
W workers, a mix of CPU-only and 1-GPU pods), runs one cycle and prints pods placed per second.

    python bench/sched_core.py [--nodes 1000] [--jobs 500] [--workers 15]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

from arranger.sched import GpuInfo, JobInfo, NodeInfo, PodRequest, Snapshot, run_cycle
from arranger.states import Role

GI = 2**30


def snapshot(nodes: int, jobs: int, workers: int) -> Snapshot:
    node_list = tuple(
        NodeInfo(f"node-{i:05d}", 32_000, 256 * GI, tuple(GpuInfo(g, "A100") for g in range(8)))
        for i in range(nodes)
    )
    job_list = []
    for j in range(jobs):
        gpu = 1000 if j % 4 == 0 else 0
        pods = [PodRequest(f"j{j}-l", Role.LEADER, -1, 4000, 16 * GI, gpu)]
        pods += [PodRequest(f"j{j}-w{w}", Role.WORKER, w, 1000, 2 * GI) for w in range(workers)]
        job_list.append(JobInfo(f"j{j:05d}", f"j{j}", "default", 5, float(j), tuple(pods)))
    return Snapshot(0.0, node_list, tuple(job_list))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--workers", type=int, default=15)
    args = parser.parse_args()
    snap = snapshot(args.nodes, args.jobs, args.workers)
    started = time.perf_counter()
    plan = run_cycle(snap)
    seconds = time.perf_counter() - started
    pods = len(plan.placements)
    print(json.dumps({
        "nodes": args.nodes, "pods_pending": args.jobs * (args.workers + 1), "pods_placed": pods,
        "cycle_s": round(seconds, 3), "pods_per_s": round(pods / seconds),
        "machine": f"{platform.machine()}, Python {platform.python_version()}",
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
