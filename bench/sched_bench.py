"""sched_bench: one cycle of the real scheduling core on a large synthetic cluster.

Default case: 5,000 empty nodes (64 cores, 512 GiB, 8 GPUs; four GPU models, one per node in
turn) and 3,000 pending jobs of 1 leader (8 cores, 32 GiB, 1 GPU) + 15 workers (4 cores,
16 GiB; 1 GPU each in every other job), priorities 1-10 and the five scoring basicPolicies
spread evenly: about two thirds of the cluster's cores and GPUs are requested. `seconds` is
the wall time of run_cycle (building the snapshot excluded); pods_per_s = pods placed / seconds.

    python bench/sched_bench.py [--nodes 5000] [--jobs 3000] [--workers 15] [--seed 1]
    python bench/sched_bench.py --scaling     # 1k, 2k, 5k, 10k nodes, jobs in proportion
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time

from arranger.sched import GpuInfo, JobInfo, NodeInfo, PodRequest, Snapshot, run_cycle
from arranger.states import BasicPolicy, Role

GI = 2**30
MODELS = ("A100", "H100", "V100", "T4")
POLICIES = (
    BasicPolicy.BINPACK,
    BasicPolicy.LEADER_FIRST,
    BasicPolicy.MIN_FRAGMENT,
    BasicPolicy.JOB_AFFINITY,
    BasicPolicy.JOB_ANTI_AFFINITY,
)


def build(nodes: int, jobs: int, workers: int, seed: int) -> Snapshot:
    rng = random.Random(seed)
    node_list = tuple(
        NodeInfo(f"node-{i:05d}", 64_000, 512 * GI, tuple(GpuInfo(g, MODELS[i % 4]) for g in range(8)))
        for i in range(nodes)
    )
    job_list = []
    for j in range(jobs):
        worker_gpu = 1000 if j % 2 else 0
        pods = [PodRequest(f"j{j}-l", Role.LEADER, -1, 8_000, 32 * GI, 1000)]
        pods += [
            PodRequest(f"j{j}-w{w}", Role.WORKER, w, 4_000, 16 * GI, worker_gpu, worker_set="actors")
            for w in range(workers)
        ]
        job_list.append(
            JobInfo(
                id=f"j{j:06d}", name=f"j{j}", queue="default", priority=rng.randint(1, 10),
                submit_time=float(j), pending=tuple(pods), basic_policy=POLICIES[j % len(POLICIES)],
            )
        )  # fmt: skip
    return Snapshot(0.0, node_list, tuple(job_list))


def measure(nodes: int, jobs: int, workers: int, seed: int) -> dict[str, object]:
    snapshot = build(nodes, jobs, workers, seed)
    started = time.perf_counter()
    plan = run_cycle(snapshot)
    seconds = time.perf_counter() - started
    placed = len(plan.placements)
    return {
        "nodes": nodes,
        "jobs": jobs,
        "pods_pending": jobs * (workers + 1),
        "pods_placed": placed,
        "seconds": round(seconds, 3),
        "pods_per_s": round(placed / seconds),
        "us_per_pod": round(seconds / max(placed, 1) * 1e6, 1),
        "machine": f"{platform.machine()}, Python {platform.python_version()}",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=15)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scaling", action="store_true", help="run 1k, 2k, 5k and 10k nodes")
    args = parser.parse_args()
    if args.scaling:
        for nodes in (1000, 2000, 5000, 10000):
            print(json.dumps(measure(nodes, nodes * 3 // 5, args.workers, args.seed)), flush=True)
    else:
        print(json.dumps(measure(args.nodes, args.jobs, args.workers, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
