"""launch_cpu: the agent's own CPU per pod to launch and to tear down, in one process, no gRPC.

A Supervisor over a fresh data directory (under $TMPDIR), with this machine's cgroups and the
fence files, as arranger-agent runs it, launches N pods (`bash -c 'date > MARK; exec sleep
600'`, 1 CPU and 256 MiB each) at once; the clock stops when all are Running. Then it kills,
forgets and purges them. Printed per round: this process's CPU (utime + stime, all threads)
per pod for the launch and for the teardown, the wall time until all ran, and the machine's
CPU (all processes, from /proc/stat) per pod until every program had run: the pods' shims,
fence watches and programs are in it, and so is anything else the machine runs.

With --shell-shim the pods start under /bin/sh's shim (process.SHIM) instead of the compiled
one (shim.c), as on a machine without a C compiler.

    python bench/launch_cpu.py [--pods 100] [--rounds 3] [--shell-shim]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from arranger.agent import launcher
from arranger.agent.cgroups import Cgroups
from arranger.agent.fence import AgentLock, ServerContact, files
from arranger.agent.orders import KillOrder, LaunchOrder
from arranger.agent.supervisor import Supervisor
from arranger.logsetup import configure
from arranger.states import PodState

PROGRAM = ["bash", "-c", 'date +%s.%N > "$MARK_DIR/$ARRANGER_POD_NAME"; exec sleep 600']


def own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def machine_cpu_s() -> float:
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:8]  # user .. softirq, idle and iowait left out below
    busy = [int(v) for i, v in enumerate(fields) if i not in (3, 4)]
    return sum(busy) / os.sysconf("SC_CLK_TCK")


async def marked(marks: Path, count: int) -> None:
    """marked returns once `count` programs have written their marks (files: nothing to
    wait on but the directory)."""
    while True:
        if len(os.listdir(marks)) >= count:
            return
        await asyncio.sleep(0.005)


async def rounds(pods: int, count: int, shell_shim: bool) -> None:
    top = Path(tempfile.mkdtemp(prefix="launch-cpu-"))
    marks = top / "marks"
    marks.mkdir()
    lock = AgentLock(top)
    lock.acquire()
    ServerContact(top, 60).set_timeout(60)
    cgroups, _ = Cgroups.detect(f"launch-cpu-{os.getpid()}")
    changed = asyncio.Event()
    tools = launcher.find_tools(switching=False)
    if shell_shim:
        tools = dataclasses.replace(tools, shim=None)
    supervisor = Supervisor(
        "launch-cpu",
        "127.0.0.1",
        top,
        lambda run: changed.set(),
        cgroups=cgroups,
        fence=files(top),
        tools=tools,
    )

    async def until(check: Callable[[list[LaunchOrder]], bool], orders: list[LaunchOrder]) -> None:
        while not check(orders):
            changed.clear()
            await asyncio.wait_for(changed.wait(), 60)

    for n in range(count):
        job = f"job{n}"
        orders = [
            LaunchOrder(
                uid=f"{job}/p{i}",
                attempt=0,
                job_id=job,
                pod_name=f"p{i}",
                command=tuple(PROGRAM),
                env={"MARK_DIR": str(marks), "ARRANGER_POD_NAME": f"{job}-p{i}"},
                cpu_cores=1.0,
                memory_bytes=256 << 20,
                grace_s=5,
            )
            for i in range(pods)
        ]
        own, machine, wall = own_cpu_s(), machine_cpu_s(), time.monotonic()
        for order in orders:
            supervisor.launch(order)
        await until(
            lambda os_: all(supervisor.runs[o.uid].state == PodState.RUNNING for o in os_),
            orders,
        )
        launch_s, running_s = own_cpu_s() - own, time.monotonic() - wall
        await marked(marks, pods * (n + 1))
        machine_s = machine_cpu_s() - machine
        own = own_cpu_s()
        for order in orders:
            supervisor.kill(KillOrder(order.uid, 0, grace_s=5))
        await until(lambda os_: all(supervisor.runs[o.uid].ended.is_set() for o in os_), orders)
        for order in orders:
            supervisor.forget(order.uid)
        supervisor.purge(job)
        teardown_s = own_cpu_s() - own
        print(
            f"launch {1000 * launch_s / pods:.2f} ms/pod, teardown {1000 * teardown_s / pods:.2f}"
            f" ms/pod, all running {running_s:.3f} s, machine {1000 * machine_s / pods:.1f} ms/pod"
        )
    await supervisor.shutdown(1)
    lock.release()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shell-shim", action="store_true", help="the shell's shim, not shim.c")
    args = parser.parse_args()
    configure("warning")
    asyncio.run(rounds(args.pods, args.rounds, args.shell_shim))


if __name__ == "__main__":
    main()
