"""bench/swarm.py runs end to end at a small N: a real server, simulated agents, real gRPC.

Only that every measure is there and sane is checked; how fast is for the benchmark to say
(bench/RESULTS.md), never for a test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AGENTS = 20


def test_swarm_registers_every_agent_and_places_every_job() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "swarm.py"),
            "--agents",
            str(AGENTS),
            "--quick",
            "--idle-s",
            "0.2",
            "--submit-s",
            "0.5",
            "--heartbeat-s",
            "0.25",
            "--node-timeout-s",
            "1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=100,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1
    r = lines[0]
    assert r["agents"] == r["registered"] == AGENTS
    assert 0 < r["register_s"] <= r["ready_s"]
    assert r["register_server_cpu_s"] >= 0 and r["rss_registered_mib"] > 0
    assert r["idle_server_cores"] >= 0 and r["idle_acks_per_s"] > 0
    # The server gives up on a node nodeTimeout after the last message it heard, never sooner.
    assert r["silent_connected_notice_s"] >= r["node_timeout_s"]
    assert r["silent_closed_notice_s"] >= r["node_timeout_s"]
    assert r["submits"] == r["acknowledged"] == r["placed"] == 10 and r["refused"] == 0
    assert r["launches"] >= 4 * r["placed"]
    assert 0 < r["submit_p50_ms"] <= r["submit_p99_ms"]
    assert r["server_cpu_ms_per_submit"] > 0 and r["placed_s_after_last_ack"] >= 0
    assert r["rss_end_mib"] > 0 and r["server_alive"]
    assert r["stream_errors"] == 0
    assert "N = 20" in done.stdout  # the table
