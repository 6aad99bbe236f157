"""usage_bench: what an agent spends sampling its pods' usage (arranger/agent/usage.py).

Starts N real pods' worth of processes (a shell and a sleeping child each, as a pod's shim and
program), then takes ROUNDS samples of all of them as the agent does and reports the CPU time
one sample costs (this process's user + system time, so its own interpreter's work only) and
what that is as a share of one core at the agent's default period (5 s). Prints JSON.

    python bench/usage_bench.py [--pods 50] [--rounds 200]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time

import psutil

from arranger.agent.usage import UsageSampler

PERIOD_S = 5.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    pods = [
        subprocess.Popen(["sh", "-c", "sleep 600 & wait"], start_new_session=True)
        for _ in range(args.pods)
    ]
    try:
        roots = {(f"job/pod-{i}", 0): p.pid for i, p in enumerate(pods)}
        deadline = time.monotonic() + 30
        while any(not psutil.Process(p.pid).children() for p in pods):
            if time.monotonic() > deadline:
                raise SystemExit("the pods' children did not start")
            time.sleep(0.01)
        sampler = UsageSampler()
        sampler.sample(roots)  # warm
        before = os.times()
        wall = time.perf_counter()
        for _ in range(args.rounds):
            uses = sampler.sample(roots)
        wall = time.perf_counter() - wall
        after = os.times()
        cpu_s = (after.user - before.user) + (after.system - before.system)
        per_sample_ms = cpu_s / args.rounds * 1000
        result = {
            "pods": args.pods,
            "pods_sampled": len(uses),
            "processes_on_machine": len(psutil.pids()),
            "cpu_ms_per_sample": round(per_sample_ms, 2),
            "wall_ms_per_sample": round(wall / args.rounds * 1000, 2),
            "core_share_at_5s_percent": round(per_sample_ms / 1000 / PERIOD_S * 100, 3),
            "machine": f"{platform.node()} ({platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} cpus), Python {sys.version.split()[0]}",
        }
        print(json.dumps(result, indent=1))
    finally:
        for p in pods:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
