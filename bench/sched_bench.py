"""sched_bench: one cycle of the real scheduling core on a large synthetic cluster.

Default case: 5,000 empty nodes (64 cores, 512 GiB, 8 GPUs; four GPU models, one per node in
turn) and 3,000 pending jobs of 1 leader (8 cores, 32 GiB, 1 GPU) + 15 workers (4 cores,
16 GiB; 1 GPU each in every other job), priorities 1-10 and the five scoring basicPolicies
spread evenly: about two thirds of the cluster's cores and GPUs are requested. `seconds` is
the wall time of run_cycle (building the snapshot excluded), `cpu_s` its CPU time (this
process); pods_per_s = pods placed / seconds, cpu_pods_per_s the same per CPU second.

    python bench/sched_bench.py [--nodes 5000] [--jobs 3000] [--workers 15] [--seed 1]
    python bench/sched_bench.py --scaling     # 1k, 2k, 5k, 10k nodes, jobs in proportion
    python bench/sched_bench.py --scenario preempt
    python bench/sched_bench.py --scenario shares
    python bench/sched_bench.py --scenario elastic

The shares scenario is the default case with every job MinFragment and actors asking a quarter,
a half or a third of one GPU (or none, every fourth job): the fragmentation measure, its GPU
choice and its cache at scale.

The elastic scenario is the default case with every job asking DRF and a minimum of the leader
and one worker: the other 14 workers of each job are spare room handed out by backfill a pod at
a time, to the job whose dominant share is smallest as the shares stand after each pod, with
more workers wanted than the cluster has room for.

The preempt scenario fills the same nodes with running low-priority jobs of the same shape
(minimum: the leader and 8 workers, so 7 surplus workers each), then times the cycle that
decides the evictions for 100 pending priority-10 gang jobs, and, once those pods are gone,
the cycle that places the 100 jobs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import random
import sys
import time

from arranger.sched import GpuInfo, JobInfo, NodeInfo, PodRequest, Res, Snapshot, run_cycle
from arranger.sched.plan import GpuShare
from arranger.sched.snapshot import RunningPod
from arranger.states import BasicPolicy, JobQueuePolicy, Role

GI = 2**30
MODELS = ("A100", "H100", "V100", "T4")
SHARES = (250, 500, 330, 0)  # the shares scenario's actors: fractions of one GPU, or none
POLICIES = (
    BasicPolicy.BINPACK,
    BasicPolicy.LEADER_FIRST,
    BasicPolicy.MIN_FRAGMENT,
    BasicPolicy.JOB_AFFINITY,
    BasicPolicy.JOB_ANTI_AFFINITY,
)


def build(
    nodes: int, jobs: int, workers: int, seed: int, shares: bool = False, elastic: bool = False
) -> Snapshot:
    rng = random.Random(seed)
    node_list = tuple(
        NodeInfo(
            f"node-{i:05d}", 64_000, 512 * GI, tuple(GpuInfo(g, MODELS[i % 4]) for g in range(8))
        )
        for i in range(nodes)
    )
    job_list = []
    for j in range(jobs):
        worker_gpu = SHARES[j % len(SHARES)] if shares else 1000 if j % 2 else 0
        policy = BasicPolicy.MIN_FRAGMENT if shares else POLICIES[j % len(POLICIES)]
        pods = [PodRequest(f"j{j}-l", Role.LEADER, -1, 8_000, 32 * GI, 1000)]
        pods += [
            PodRequest(
                f"j{j}-w{w}",
                Role.WORKER,
                w,
                4_000,
                16 * GI,
                worker_gpu,
                worker_set="actors",
                in_minimum=not elastic or w < 1,
            )
            for w in range(workers)
        ]
        job_list.append(
            JobInfo(
                id=f"j{j:06d}",
                name=f"j{j}",
                queue="default",
                priority=1 if elastic else rng.randint(1, 10),
                submit_time=float(j),
                pending=tuple(pods),
                basic_policy=policy,
                job_queue_policy=JobQueuePolicy.DRF if elastic else JobQueuePolicy.PRIORITY,
            )
        )
    return Snapshot(0.0, node_list, tuple(job_list))


def _job(j: int, workers: int, priority: int, minimum: int | None = None) -> JobInfo:
    worker_gpu = 1000 if j % 2 else 0
    pods = [PodRequest(f"j{j}-l", Role.LEADER, -1, 8_000, 32 * GI, 1000)]
    pods += [
        PodRequest(
            f"j{j}-w{w}",
            Role.WORKER,
            w,
            4_000,
            16 * GI,
            worker_gpu,
            worker_set="actors",
            in_minimum=minimum is None or w < minimum,
        )
        for w in range(workers)
    ]
    return JobInfo(f"j{j:06d}", f"j{j}", "default", priority, float(j), tuple(pods))


def full_cluster(nodes: int, seed: int) -> tuple[list[NodeInfo], list[JobInfo]]:
    """full_cluster: nodes filled with running jobs of priority 1-3, each pod where it fits."""
    rng = random.Random(seed)
    free = [[64_000, 512 * GI, [0] * 8] for _ in range(nodes)]
    running_jobs: list[JobInfo] = []
    cursor, j = 0, 0
    while cursor < nodes:
        template = _job(j, 15, rng.randint(1, 3), minimum=8)
        placed: list[RunningPod] = []
        for pod in template.pending:
            while cursor < nodes:
                cpu, mem, gpus = free[cursor]
                want = pod.gpu_milli // 1000
                idle = [g for g in range(8) if gpus[g] == 0][:want]
                if cpu >= pod.cpu_milli and mem >= pod.memory_bytes and len(idle) == want:
                    free[cursor][0] -= pod.cpu_milli
                    free[cursor][1] -= pod.memory_bytes
                    for g in idle:
                        gpus[g] = 1000
                    shares = tuple(GpuShare(g, 1000) for g in idle)
                    placed.append(
                        RunningPod(
                            pod.name,
                            f"node-{cursor:05d}",
                            pod.request,
                            shares,
                            pod.role,
                            pod.in_minimum,
                            float(j),
                        )
                    )
                    break
                cursor += 1
        if len(placed) == len(template.pending):
            held = Res.total(placed)
            running_jobs.append(
                dataclasses.replace(
                    template, pending=(), running=tuple(placed), allocated=held, start_time=float(j)
                )
            )
        j += 1
    node_list = [
        NodeInfo(
            f"node-{i:05d}",
            64_000,
            512 * GI,
            tuple(GpuInfo(g, MODELS[i % 4], free[i][2][g]) for g in range(8)),
            64_000 - free[i][0],
            512 * GI - free[i][1],
        )
        for i in range(nodes)
    ]
    return node_list, running_jobs


def measure_preempt(nodes: int, preemptors: int, seed: int) -> dict[str, object]:
    node_list, running = full_cluster(nodes, seed)
    urgent = [_job(10_000_000 + k, 15, 10) for k in range(preemptors)]
    snapshot = Snapshot(0.0, tuple(node_list), tuple(running + urgent))
    started, cpu = time.perf_counter(), time.process_time()
    plan = run_cycle(snapshot)
    evict_s, evict_cpu_s = time.perf_counter() - started, time.process_time() - cpu
    evicted = {(e.job_id, e.pod) for e in plan.evictions}
    served = sum(1 for j in urgent if plan.decisions[j.id].reason == "Preempting")
    # The evicted pods are gone: free their resources and run the next cycle.
    used_cpu = {n.name: n.used_cpu_milli for n in node_list}
    used_mem = {n.name: n.used_memory_bytes for n in node_list}
    gpu_free: dict[str, set[int]] = {n.name: set() for n in node_list}
    survivors = []
    for job in running:
        keep = []
        for pod in job.running:
            if (job.id, pod.name) in evicted:
                used_cpu[pod.node] -= pod.request.cpu_milli
                used_mem[pod.node] -= pod.request.memory_bytes
                gpu_free[pod.node] |= {g.index for g in pod.gpus}
            else:
                keep.append(pod)
        survivors.append(dataclasses.replace(job, running=tuple(keep), allocated=Res.total(keep)))
    after_nodes = tuple(
        dataclasses.replace(
            n,
            used_cpu_milli=used_cpu[n.name],
            used_memory_bytes=used_mem[n.name],
            gpus=tuple(
                dataclasses.replace(
                    g, used_milli=0 if g.index in gpu_free[n.name] else g.used_milli
                )
                for g in n.gpus
            ),
        )
        for n in node_list
    )
    started, cpu = time.perf_counter(), time.process_time()
    after = run_cycle(Snapshot(1.0, after_nodes, tuple(survivors + urgent)))
    place_s, place_cpu_s = time.perf_counter() - started, time.process_time() - cpu
    placed_jobs = len({p.job_id for p in after.placements if p.job_id.startswith("j1")})
    return {
        "scenario": "preempt",
        "nodes": nodes,
        "running_jobs": len(running),
        "running_pods": sum(len(j.running) for j in running),
        "preemptors": preemptors,
        "preemptors_served": served,
        "pods_evicted": len(plan.evictions),
        "evict_cycle_s": round(evict_s, 3),
        "evict_cycle_cpu_s": round(evict_cpu_s, 3),
        "jobs_placed_next_cycle": placed_jobs,
        "place_cycle_s": round(place_s, 3),
        "place_cycle_cpu_s": round(place_cpu_s, 3),
        "machine": f"{platform.machine()}, Python {platform.python_version()}",
    }


def measure(
    nodes: int, jobs: int, workers: int, seed: int, scenario: str = "place"
) -> dict[str, object]:
    shares, elastic = scenario == "shares", scenario == "elastic"
    snapshot = build(nodes, jobs, workers, seed, shares, elastic)
    started, cpu = time.perf_counter(), time.process_time()
    plan = run_cycle(snapshot)
    seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu
    placed = len(plan.placements)
    return {
        "scenario": scenario,
        "nodes": nodes,
        "jobs": jobs,
        "pods_pending": jobs * (workers + 1),
        "pods_placed": placed,
        "seconds": round(seconds, 3),
        "cpu_s": round(cpu_s, 3),
        "pods_per_s": round(placed / seconds),
        "cpu_pods_per_s": round(placed / cpu_s),
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
    parser.add_argument(
        "--scenario", choices=("place", "shares", "elastic", "preempt"), default="place"
    )
    parser.add_argument("--preemptors", type=int, default=100)
    args = parser.parse_args()
    if args.scenario == "preempt":
        print(json.dumps(measure_preempt(args.nodes, args.preemptors, args.seed)))
    elif args.scaling:
        for nodes in (1000, 2000, 5000, 10000):
            print(json.dumps(measure(nodes, nodes * 3 // 5, args.workers, args.seed)), flush=True)
    else:
        print(json.dumps(measure(args.nodes, args.jobs, args.workers, args.seed, args.scenario)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
