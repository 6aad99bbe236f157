"""Plain processes are held to their request in a cgroup of their own: a memory hog in 64 MiB is
killed by the kernel and reported OOMKilled; a pod within its limits runs inside its cgroup,
which is gone once the pod is. Skipped where this machine's cgroups cannot be written."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from arranger.agent.cgroups import Cgroups
from arranger.agent.orders import LaunchOrder
from arranger.agent.runs import PodRun
from arranger.agent.supervisor import Supervisor
from arranger.states import PodState

MIB = 2**20


async def run_pod(tmp_path: Path, cgroups: Cgroups, code: str, memory: int) -> tuple[PodRun, str]:
    done = asyncio.Event()
    supervisor = Supervisor(
        "n1",
        "127.0.0.1",
        tmp_path,
        lambda run: run.ended.is_set() and done.set(),
        cgroups=cgroups,
    )
    order = LaunchOrder(
        uid="j1/p",
        attempt=0,
        job_id="j1",
        pod_name="p",
        cpu_cores=0.5,
        memory_bytes=memory,
        command=(sys.executable, "-c", code),
    )
    supervisor.launch(order)
    await asyncio.wait_for(done.wait(), 60)
    return supervisor.runs["j1/p"], supervisor.files.log_path("j1/p", 0).read_text()


async def test_a_memory_hog_is_oom_killed_and_reported(tmp_path: Path, cgroups: Cgroups) -> None:
    hog = "chunks = []\nwhile True:\n    chunks.append(bytearray(8 * 2**20))\n"
    run, log = await run_pod(tmp_path, cgroups, hog, 64 * MIB)
    assert (run.state, run.reason) == (PodState.FAILED, "OOMKilled"), log
    assert run.exit_code == 137
    assert not any((base / "j1_p.0").exists() for base in cgroups.bases.values())


async def test_a_pod_runs_in_its_own_cgroup_with_its_limits(
    tmp_path: Path, cgroups: Cgroups
) -> None:
    show = (
        "import pathlib\n"
        "root = pathlib.Path('/sys/fs/cgroup')\n"
        "for line in pathlib.Path('/proc/self/cgroup').read_text().splitlines():\n"
        "    print(line)\n"
        "    _, controllers, path = line.split(':', 2)\n"
        "    if controllers == 'memory':\n"
        "        print('limit', (root / 'memory' / path.lstrip('/') / 'memory.limit_in_bytes').read_text().strip())\n"
        "    if controllers == '' and (root / 'cgroup.controllers').is_file():\n"
        "        print('limit', (root / path.lstrip('/') / 'memory.max').read_text().strip())\n"
    )
    run, log = await run_pod(tmp_path, cgroups, show, 256 * MIB)
    assert run.state == PodState.SUCCEEDED, log
    assert f"limit {256 * MIB}" in log.splitlines(), log
    wanted = f"/arranger/test-{os.getpid()}/j1_p.0"
    if cgroups.version == 1:
        memory = next(line for line in log.splitlines() if ":memory:" in line)
        assert memory.endswith(wanted), log
    else:
        assert any(line.endswith(wanted) for line in log.splitlines()), log


def test_a_pod_cgroup_weighs_its_request_in_cores(cgroups: Cgroups) -> None:
    cgroup = cgroups.create("j1_w.0", 64 * MIB, 1500)
    try:
        cpu = cgroup.dirs["cpu"]
        if cgroups.version == 1:
            assert (cpu / "cpu.shares").read_text().strip() == "1536"
            assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "150000"
        else:
            assert (cpu / "cpu.weight").read_text().strip() == "150"
    finally:
        cgroup.remove()
