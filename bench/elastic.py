"""elastic: what elastic worker sets are worth, on simulated time through the real controller
and scheduling core.

The same mixed workload of RL jobs is replayed once per variant through the real
`arranger.server.controller.Controller` (stimuli in, Effects out), the server's
`SchedulingState` (the kept snapshot) and `Timers`, and the real core (`run_cycle`), with an
injected clock: a discrete-event loop, no sleeps, no processes.

Model:
- Agents are simulated: a launch order is answered by a RUNNING report LAUNCH_S later, a kill
  order by a KILLED report min(grace, EXIT_S) later. A scheduling cycle runs, as the server's
  does, when something changed (at most one per CYCLE_S) or when the plan's wake time comes.
- A job is a learner (the leader: 1 GPU, 4 cores) and one set of actors (1 core each, or a
  quarter GPU and 1 core). Its work is W units; while its learner runs with n actors running,
  it does n ** ALPHA units per second (diminishing returns); when W is done its learner
  reports SUCCEEDED. W is drawn as D * maxCounts ** ALPHA for a duration D at full size.
- The learner saves a checkpoint every CHECKPOINT_S while it runs; a learner that stops for
  any other reason than success loses the work since then (actors hold no state). With an
  eviction notice for the whole job it writes a checkpoint (SAVE_S) and confirms it, so it
  loses nothing.
- Half the jobs are elastic-kind (drawn as such), half rigid; priorities 2, 5, 8. Rigid jobs
  are the same in every variant: counts = minWorkersNum = their size. The elastic-kind jobs
  are, per variant: `fixed-max` counts = minWorkersNum = maxCounts; `fixed-mid` the same at
  (start + max) / 2; `surplus` counts = maxCounts with minWorkersNum = start (the scheduler
  places the rest as surplus, no learner involved); `elastic` counts = minWorkersNum = start,
  maxCounts = max, and the learner scales; `elastic-notice` the same with
  evictionNoticeSeconds = NOTICE_S on every job.
- The elastic learner looks every POLL_S: when all its wanted actors run (none under notice)
  it asks for more (Controller.scale, after scale_problem allows it), at most doubling, up
  to maxCounts and to the room it sees (free room of schedulable, unreserved nodes, per node,
  less what every waiting pod asks for). When some wanted actors have not run for
  PATIENCE_S (preempted, or no room after all) it scales down to the highest actor that
  holds a node, never below its start count.

JCT is finish - submit; makespan is the last finish; GPU and CPU allocation is what pods hold
(placed, starting, running or stopping) over the cluster, time-averaged over the makespan.

Shapes: arrivals uniform at random over a span set by the offered load (the jobs' dominant
demand at full size, CPU or GPU, over the cluster's): steady 1.0, heavy 1.6, light 0.5; burst:
every job within the first 10 minutes.

    python bench/elastic.py [--jobs 80] [--seed 1] [--nodes 8] [--shape steady --shape heavy]
    python bench/elastic.py --shape light --shape burst --json
    python bench/elastic.py --quick    # 30 jobs on 4 nodes, steady
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Iterable
from typing import Any

import elastic_sim  # bench/, run as a script
from elastic_sim import NODE_CPU, NODE_GPUS, SHAPES, VARIANTS, JobPlan, Sim, Variant, workload

from arranger.states import Stage


def averages(
    samples: list[tuple[float, int, int]], start: float, end: float
) -> tuple[float, float]:
    """averages: the time-averaged GPU and CPU milli held over [start, end] (a step function
    of the samples)."""
    if end <= start:
        return 0.0, 0.0
    gpu = cpu = 0.0
    for i, (t, g, c) in enumerate(samples):
        t_next = samples[i + 1][0] if i + 1 < len(samples) else math.inf
        lo, hi = max(t, start), min(t_next, end)
        if hi > lo:
            gpu, cpu = gpu + g * (hi - lo), cpu + c * (hi - lo)
    return gpu / (end - start), cpu / (end - start)


def measure(plans: list[JobPlan], variant: Variant, nodes: int) -> dict[str, Any]:
    """measure replays the workload under the variant and sums it up."""
    started = time.process_time()
    sim = Sim(plans, variant, nodes)
    sim.run(limit_s=30 * 86400.0)
    cpu_s = time.process_time() - started
    runs = list(sim.runs.values())
    finish = {r.plan.name: r.job.finish_time for r in runs if r.job.stage == Stage.SUCCEEDED}
    ended = [r for r in runs if finish.get(r.plan.name) is not None]
    jct = {r.plan.name: (finish[r.plan.name] or 0.0) - r.job.submit_time for r in ended}
    makespan = max((finish[r.plan.name] or 0.0 for r in ended), default=0.0)
    gpu_cap, cpu_cap = sim.capacity
    gpu, cpu = averages(sim.stats.samples, 0.0, makespan)
    tenths = []
    for k in range(10):
        g, c = averages(sim.stats.samples, makespan * k / 10, makespan * (k + 1) / 10)
        tenths.append((round(100 * g / gpu_cap), round(100 * c / cpu_cap)))

    def mean(kind: bool | None) -> float:
        values = [jct[r.plan.name] for r in ended if kind is None or r.plan.elastic == kind]
        return round(statistics.fmean(values), 1) if values else 0.0

    values = sorted(jct.values()) or [0.0]
    return {
        "variant": variant.name,
        "jobs": len(plans),
        "succeeded": len(ended),
        "jct_mean_s": mean(None),
        "jct_p50_s": round(statistics.median(values), 1),
        "jct_p90_s": round(values[min(len(values) - 1, int(0.9 * len(values)))], 1),
        "jct_mean_elastic_kind_s": mean(True),
        "jct_mean_rigid_s": mean(False),
        "makespan_s": round(makespan, 1),
        "gpu_alloc_pct": round(100 * gpu / gpu_cap, 1),
        "cpu_alloc_pct": round(100 * cpu / cpu_cap, 1),
        "alloc_tenths_pct": tenths,
        "scale_ups": sim.stats.scale_ups,
        "scale_downs": sim.stats.scale_downs,
        "evicted_pods": sim.stats.evicted_pods,
        "whole_job_evictions": sim.stats.whole_evictions,
        "notices": sim.stats.notices,
        "confirmed_checkpoints": sim.stats.confirms,
        "lost_work_pct": round(100 * sum(r.lost for r in runs) / sum(p.work for p in plans), 2),
        "held_at_end_milli": list(sim.held_total),  # GPU, CPU: nothing may be left held
        "cycles": sim.stats.cycles,
        "cpu_s": round(cpu_s, 2),
    }


def model() -> str:
    """model: the model as the module's docstring states it, with the constants' values."""
    text = __doc__ or ""
    part = text[text.index("Model:") : text.index("Shapes:")]
    names = "ALPHA LAUNCH_S EXIT_S GRACE_S CYCLE_S POLL_S PATIENCE_S CHECKPOINT_S SAVE_S NOTICE_S"
    values = [f"{n} = {getattr(elastic_sim, n):g}" for n in names.split()]
    return part + ", ".join(values[:5]) + ",\n" + ", ".join(values[5:])


def render(shape: str, plans: list[JobPlan], nodes: int, results: list[dict[str, Any]]) -> str:
    elastic = sum(p.elastic for p in plans)
    span = max((p.arrival_s for p in plans), default=0.0)
    lines = [
        f"== Workload {shape}: {len(plans)} jobs ({elastic} elastic-kind), arrivals over "
        f"{span / 3600:.1f} h, on {nodes} nodes x {NODE_GPUS} GPUs x {NODE_CPU // 1000} cores ==",
        "",
        "== Results ==",
        f"{'variant':<15}{'done':>5}{'JCT mean':>10}{'p50':>8}{'p90':>8}{'elastic':>9}"
        f"{'rigid':>8}{'makespan':>10}{'GPU%':>6}{'CPU%':>6}{'up/down':>9}{'evicted':>8}"
        f"{'whole':>6}{'lost%':>6}{'cpu s':>7}",
    ]
    for r in results:
        ups = f"{r['scale_ups']}/{r['scale_downs']}"
        lines.append(
            f"{r['variant']:<15}{r['succeeded']:>5}{r['jct_mean_s']:>10.0f}{r['jct_p50_s']:>8.0f}"
            f"{r['jct_p90_s']:>8.0f}{r['jct_mean_elastic_kind_s']:>9.0f}"
            f"{r['jct_mean_rigid_s']:>8.0f}{r['makespan_s']:>10.0f}{r['gpu_alloc_pct']:>6.1f}"
            f"{r['cpu_alloc_pct']:>6.1f}{ups:>9}"
            f"{r['evicted_pods']:>8}{r['whole_job_evictions']:>6}{r['lost_work_pct']:>6.1f}"
            f"{r['cpu_s']:>7.1f}"
        )
    lines += ["", "== Allocation over time (GPU%/CPU% per tenth of each variant's makespan) =="]
    lines.append(
        f"{'variant':<15}" + "".join(f"{f'{10 * k}-{10 * k + 10}%':>9}" for k in range(10))
    )
    for r in results:
        cells = "".join(f"{f'{g}/{c}':>9}" for g, c in r["alloc_tenths_pct"])
        lines.append(f"{r['variant']:<15}{cells}")
    return "\n".join(lines)


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=80)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument(
        "--shape",
        action="append",
        choices=tuple(SHAPES),
        help="workload shape; repeat for several (default: steady and heavy)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        choices=[v.name for v in VARIANTS],
        help="repeat for several (default: all)",
    )
    parser.add_argument("--quick", action="store_true", help="30 jobs on 4 nodes, steady only")
    parser.add_argument("--json", action="store_true", help="also one JSON line per run")
    args = parser.parse_args(None if argv is None else list(argv))
    jobs, nodes, shapes = args.jobs, args.nodes, args.shape or ["steady", "heavy"]
    if args.quick:
        jobs, nodes, shapes = min(jobs, 30), min(nodes, 4), args.shape or ["steady"]
    variants = [v for v in VARIANTS if not args.variant or v.name in args.variant]
    print("Elastic actors: the same jobs with elastic and fixed-size worker sets")
    print(f"seed {args.seed}, {platform.machine()}, Python {platform.python_version()}")
    print(model())
    for shape in shapes:
        plans = workload(jobs, args.seed, nodes, shape)
        results = [measure(plans, v, nodes) for v in variants]
        print()
        print(render(shape, plans, nodes, results))
        if args.json:
            for r in results:
                print(json.dumps({"shape": shape, "seed": args.seed, "nodes": nodes, **r}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
