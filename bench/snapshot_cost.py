"""snapshot_cost: what one cycle's input costs the server, kept from changes or built whole.

A real controller with N registered nodes (64 cores, 8 GPUs) and J jobs of 1+3 pods: a tenth
still waiting, the rest placed by the real scheduling core and running. Then one job is
submitted (the change), and the snapshot is taken twice: by the server's SchedulingState, kept
from each change's effects, and by build_snapshot from every record (what every cycle cost
before). Prints CPU milliseconds per snapshot, median of the rounds, and those of one run of
the core on the last snapshot beside them (core_all_waiting_ms: every waiting job placed).

Then, every job placed and running, each round submits one job, takes the kept snapshot
(cycle_snapshot_ms), runs the core on it (core_ms, median; core_ms_min_max) and applies its
plan, the pods reported running: the cost of one cycle after one change. `--policy` is the
basicPolicy of the jobs submitted in these rounds (BinPack, as every other job, by default).

    python bench/snapshot_cost.py [--nodes 5000] [--jobs 3000] [--rounds 20] [--policy BinPack]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

from arranger.client.specfile import load_job_yaml
from arranger.sched import SchedulerConfig, run_cycle
from arranger.server.controller import Controller
from arranger.server.convert import spec_to_json
from arranger.server.model import GpuRecord
from arranger.server.nodes import NodeRegistration, PodReport
from arranger.server.snapshot import SchedulingState, build_snapshot
from arranger.server.validation import parse_job
from arranger.states import PodState

GI = 2**30
SPEC = """
metadata: {{name: j{n}}}
spec:
  schedulerPolicy: {{basicPolicy: {policy}}}
  leader: {{name: l, template: {{command: [l], resources: {{cpu: "8", gpu: "1"}}}}}}
  workerSets: [{{name: w, counts: 3, template: {{command: [w], resources: {{cpu: "4"}}}}}}]
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--policy", default="BinPack", help="basicPolicy of the jobs submitted one per cycle"
    )
    args = parser.parse_args()
    c = Controller()
    state = SchedulingState(c, [SchedulerConfig().machine_group_label])  # as the server
    now = 1000.0
    for i in range(args.nodes):
        gpus = tuple(GpuRecord(g, f"GPU-{i}-{g}", "A100", 80 * GI) for g in range(8))
        reg = NodeRegistration(f"node-{i:05d}", "127.0.0.1", 64_000, 512 * GI, gpus=gpus)
        state.changed(c.node_registered(reg, now))
    spec = parse_job(load_job_yaml(SPEC.format(n=0, policy="BinPack")))
    text = spec_to_json(spec)
    submitted = 0

    def submit() -> None:
        nonlocal submitted
        _, fx = c.submit(f"id{submitted:06d}", spec, text, now)
        state.changed(fx)
        submitted += 1

    running = args.jobs - args.jobs // 10
    for _ in range(running):
        submit()
    placed: set[str] = set()

    def run_pods() -> None:
        """run_pods reports every placed pod not reported yet as running."""
        for job in list(c.jobs.values()):
            for pod in job.pods.values():
                if pod.state.holds_resources and pod.uid not in placed:
                    placed.add(pod.uid)
                    report = PodReport(pod.uid, pod.attempt, PodState.RUNNING, pid=1)
                    state.changed(c.pod_reports(pod.node, [report], now))

    state.changed(c.apply_plan(run_cycle(state.snapshot(now)), now))
    run_pods()
    for _ in range(args.jobs - running):
        submit()
    state.snapshot(now)
    kept, whole = [], []
    for _ in range(args.rounds):
        submit()
        started = time.process_time()
        a = state.snapshot(now)
        kept.append(time.process_time() - started)
        started = time.process_time()
        b = build_snapshot(c, now)
        whole.append(time.process_time() - started)
        assert len(a.jobs) == len(b.jobs) and a.nodes == b.nodes
    started = time.process_time()
    state.changed(c.apply_plan(run_cycle(a), now))
    core = time.process_time() - started
    run_pods()
    cycle_snapshot, cycle_core = [], []
    spec = parse_job(load_job_yaml(SPEC.format(n=0, policy=args.policy)))
    text = spec_to_json(spec)
    for _ in range(args.rounds):
        submit()
        started = time.process_time()
        snapshot = state.snapshot(now)
        cycle_snapshot.append(time.process_time() - started)
        started = time.process_time()
        plan = run_cycle(snapshot)
        cycle_core.append(time.process_time() - started)
        assert len(plan.placements) == 4, plan.decisions
        state.changed(c.apply_plan(plan, now))
        run_pods()
    result = {
        "nodes": args.nodes,
        "jobs": len(c.jobs),
        "snapshot_jobs": len(a.jobs),
        "kept_ms": round(statistics.median(kept) * 1000, 2),
        "whole_ms": round(statistics.median(whole) * 1000, 2),
        "core_all_waiting_ms": round(core * 1000, 1),
        "running_jobs": sum(1 for j in c.jobs.values() if j.start_time is not None),
        "cycle_snapshot_ms": round(statistics.median(cycle_snapshot) * 1000, 2),
        "core_ms": round(statistics.median(cycle_core) * 1000, 2),
        "policy": args.policy,
        "core_ms_min_max": [round(min(cycle_core) * 1000, 2), round(max(cycle_core) * 1000, 2)],
        "ratio": round(statistics.median(whole) / max(statistics.median(kept), 1e-9), 1),
        "machine": f"{platform.machine()}, Python {platform.python_version()}",
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
