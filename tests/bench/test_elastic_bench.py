"""bench/elastic.py runs at a tiny size: every job of every variant completes, elastic jobs
scale, nothing is left held, and the report has its sections.

What the numbers say is for the benchmark (bench/RESULTS.md), never for a test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = {"fixed-max", "fixed-mid", "surplus", "elastic", "elastic-notice"}


def test_the_elastic_benchmark_completes_every_job_in_every_variant() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "elastic.py"),
            "--quick",
            "--jobs",
            "16",
            "--seed",
            "3",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for section in (
        "Model:",
        "== Workload steady: 16 jobs",
        "== Results ==",
        "== Allocation over time",
    ):
        assert section in out
    runs = {r["variant"]: r for r in map(json.loads, (x for x in out.splitlines() if x[:1] == "{"))}
    assert set(runs) == VARIANTS
    for name, r in runs.items():
        assert r["succeeded"] == r["jobs"] == 16, name
        assert r["held_at_end_milli"] == [0, 0], name  # every pod's room came back
        assert 0 < r["gpu_alloc_pct"] <= 100 and 0 < r["cpu_alloc_pct"] <= 100, name
        assert len(r["alloc_tenths_pct"]) == 10, name
        assert r["jct_mean_s"] > 0 and r["makespan_s"] >= r["jct_p50_s"], name
    assert runs["elastic"]["scale_ups"] > 0 and runs["elastic-notice"]["scale_ups"] > 0
    assert all(runs[v]["scale_ups"] == 0 for v in ("fixed-max", "fixed-mid", "surplus"))
