"""e2e_latency: how fast a submitted gang becomes running programs, end to end, and at what CPU.

Starts arranger-server and 4 arranger-agent processes on 127.0.0.1 (each its own process, as
in a real deployment). Each agent declares 50 CPUs (`capacity`, a logical size, as the Slurm
peer's CPUs=50 per node), so gangs of pods that ask for a whole core each, as actors do, fit
on a small machine. Every pod's program writes the time as its first line
(`date +%s.%N > $MARK_DIR/$ARRANGER_POD_NAME` in bash, or the same in `python -c`), then sleeps.
Measured, in the same way as bench/peers' slurm_gang.sh measures Slurm:
- gangs of 1 leader + W workers (W in --widths), one after another: from submit until every
  pod's program has run its first line (`programs`), and until the agents have reported every
  pod Running (`confirmed`, seen on a watch);
- bursts of 50 gangs of 1 + 3 submitted at once: gangs/s until every program has run, and
  until every pod is confirmed;
- CPU of the server, of the agents and of this bench (utime + stime from /proc/PID/stat),
  and of the whole machine (/proc/stat), over each measured window only, per launched pod.
Prints one JSON line. With `--profile DIR`, py-spy records the server and every agent during
the bursts (raw collapsed stacks in DIR). With `--image`, every pod runs its program in a
podman container of that image (one with bash and date, the marks through a volume).

    python bench/e2e_latency.py [--pods bash|python] [--jobs 10] [--bursts 3] [--profile DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from arranger.client.sdk import AsyncClient, progress_of

MARKS = "/arranger-marks"  # where a container sees the mark directory
BASH_PROGRAM = ["bash", "-c", 'date +%s.%N > "$MARK_DIR/$ARRANGER_POD_NAME"; exec sleep 600']
PYTHON_PROGRAM = [
    sys.executable,
    "-c",
    "import os, time; open(os.environ['MARK_DIR'] + '/' + os.environ['ARRANGER_POD_NAME'], 'w')"
    ".write('%.6f' % time.time()); time.sleep(600)",
]
AGENTS = 4
AGENT_CPUS = 50  # declared per agent: 4 x 50 = 200 cores, 50 gangs of 4 one-core pods
POD_CPU = "1"
POD_MEMORY = "256Mi"
BURST_GANGS = 50
BURST_WORKERS = 3
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def job(name: str, workers: int, command: list[str], marks: Path, image: str) -> dict[str, object]:
    template: dict[str, object] = {
        "command": command,
        "env": {"MARK_DIR": MARKS if image else str(marks)},
        "resources": {"cpu": POD_CPU, "memory": POD_MEMORY},
    }
    spec: dict[str, object] = {
        "minWorkersNum": workers,
        "leader": {"name": "learner", "template": template},
        "workerSets": [{"name": "actors", "counts": workers, "template": template}],
    }
    if image:
        template["image"] = image
        spec["volumes"] = [{"name": "marks", "hostPath": str(marks), "mountPath": MARKS}]
    return {"metadata": {"name": name}, "spec": spec}


def cpu_ticks(pid: int) -> int:
    """cpu_ticks: utime + stime of the process (all its threads, not its children)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5)


class Cluster:
    """Cluster runs the daemons as separate processes, each in its own process group."""

    def __init__(self, root: Path, agents: int) -> None:
        self.root = root
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.agents = agents
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        bin_dir = Path(sys.executable).parent
        log = open(self.root / "daemons.log", "ab")  # noqa: SIM115 (closed with the processes)
        settings = self.root / "server.yaml"
        settings.write_text(f'allowedHostPaths: [{self.root}]\nhttpListen: ""\n')
        server = [
            str(bin_dir / "arranger-server"),
            "--config",
            str(settings),
            "--listen",
            self.address,
            "--data-dir",
            str(self.root / "server"),
            "--insecure",
        ]
        subprocess.run([*server, "--init"], check=True, capture_output=True)  # a new cluster
        self.procs.append(
            subprocess.Popen(
                [*server, "--log-level", "warning"],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        )
        agent_settings = self.root / "agent.yaml"
        agent_settings.write_text(f"capacity: {{cpu: {AGENT_CPUS}, memory: 64Gi}}\n")
        for i in range(self.agents):
            self.procs.append(
                subprocess.Popen(
                    [
                        str(bin_dir / "arranger-agent"),
                        "--config",
                        str(agent_settings),
                        "--server",
                        self.address,
                        "--node-name",
                        f"bench-{i}",
                        "--address",
                        "127.0.0.1",
                        "--data-dir",
                        str(self.root / f"agent-{i}"),
                        "--run-as-root",
                        "--log-level",
                        "warning",
                    ],
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                )
            )

    @property
    def server_pid(self) -> int:
        return self.procs[0].pid

    @property
    def agent_pids(self) -> list[int]:
        return [proc.pid for proc in self.procs[1:]]

    def stop(self) -> None:
        for proc in reversed(self.procs):  # agents first: they stop their pods
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@dataclass
class Cpu:
    """Cpu adds up CPU ticks over measured windows: the server's, the agents', this bench's
    own (its submits, watch stream and polls) and the whole machine's (/proc/stat: the pods'
    shims and programs are in it, and anything else the machine runs)."""

    cluster: Cluster
    server_ticks: int = 0
    agent_ticks: int = 0
    bench_ticks: int = 0
    machine_ticks: int = 0
    pods: int = 0
    _start: tuple[int, int, int, int] = (0, 0, 0, 0)

    def _now(self) -> tuple[int, int, int, int]:
        agents = sum(cpu_ticks(pid) for pid in self.cluster.agent_pids)
        return cpu_ticks(self.cluster.server_pid), agents, cpu_ticks(os.getpid()), machine_ticks()

    def begin(self) -> None:
        self._start = self._now()

    def end(self, pods: int) -> None:
        server, agents, bench, machine = self._now()
        self.server_ticks += server - self._start[0]
        self.agent_ticks += agents - self._start[1]
        self.bench_ticks += bench - self._start[2]
        self.machine_ticks += machine - self._start[3]
        self.pods += pods

    def per_pod(self) -> dict[str, float]:
        ms = 1000 / TICKS_PER_S / max(1, self.pods)
        return {
            "server_cpu_ms_per_pod": round(self.server_ticks * ms, 2),
            "agents_cpu_ms_per_pod": round(self.agent_ticks * ms, 2),
            "bench_cpu_ms_per_pod": round(self.bench_ticks * ms, 2),
            "machine_cpu_ms_per_pod": round(self.machine_ticks * ms, 2),
            "pods": self.pods,
        }


def machine_ticks() -> int:
    """machine_ticks: the machine's busy CPU ticks since boot (/proc/stat, idle and iowait
    left out)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:8]
    return sum(int(v) for i, v in enumerate(fields) if i not in (3, 4))


@dataclass
class Watcher:
    """Watcher follows every job on one watch stream: how many of each job's pods the agents
    have reported Running, and who waits for which jobs to be all Running."""

    running: dict[str, int] = field(default_factory=dict)
    leaders: dict[str, bool] = field(default_factory=dict)
    waiting: list[tuple[dict[str, int], asyncio.Future[float]]] = field(default_factory=list)

    async def follow(self, client: AsyncClient, subscribed: asyncio.Event) -> None:
        async for event in client.watch(""):
            if event.type == "SYNCED":
                subscribed.set()
            progress = progress_of(event)
            if progress is None:
                continue
            for pod in event.pods:  # the pods that changed: the leader's state when it did
                if pod.role == "leader":
                    self.leaders[event.name] = pod.state == "Running"
            count = progress.running_workers + self.leaders.get(event.name, False)
            self.running[event.name] = count
            self._check()

    def all_running(self, wanted: dict[str, int]) -> asyncio.Future[float]:
        """all_running: a future of the wall-clock time when every job in `wanted` has its
        number of pods Running."""
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiting.append((wanted, future))
        self._check()
        return future

    def _check(self) -> None:
        for wanted, future in list(self.waiting):
            if all(self.running.get(name, 0) >= n for name, n in wanted.items()):
                self.waiting.remove((wanted, future))
                if not future.done():
                    future.set_result(time.time())


async def all_marks(marks: Path, pods: set[str]) -> list[float]:
    """all_marks: the times `pods` wrote, in order, once each has written its mark. It
    polls the directory's listing, one call every 5 ms, and reads the marks once all are
    there: trying every missing file at each poll cost up to 134 ms of CPU over a burst's
    0.8 s (9 ms this way), taken from the launches it measures. The clock is in the marks, not
    in the poll."""
    while not pods.issubset(os.listdir(marks)):  # noqa: ASYNC110 (files: nothing to wait on)
        await asyncio.sleep(0.005)
    seen: dict[str, float] = {}
    while True:
        for name in pods - seen.keys():
            with contextlib.suppress(OSError, ValueError):
                seen[name] = float((marks / name).read_text())  # empty while being written
        if len(seen) == len(pods):
            return sorted(seen.values())
        await asyncio.sleep(0.005)


def pod_names(name: str, workers: int) -> set[str]:
    return {f"{name}-learner", *(f"{name}-actors-{i}" for i in range(workers))}


async def drained(client: AsyncClient) -> None:
    """drained returns once no node holds anything for a pod (the deleted jobs' pods ended)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if all(node.allocated.cpu == 0 for node in await client.nodes()):
            return
        await asyncio.sleep(0.05)
    raise RuntimeError("pods still held 60 s after their jobs were deleted")


async def wait_nodes(client: AsyncClient, count: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # the server may still be starting
            nodes = await client.nodes()
            if sum(1 for n in nodes if n.state == "Ready") == count:
                return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{count} agents did not join within 30 s")


@dataclass
class Run:
    cluster: Cluster
    client: AsyncClient
    watcher: Watcher
    command: list[str]
    image: str
    marks: Path
    timeline: list[float] = field(default_factory=list)  # the last `gangs`: acked, then marks

    async def gangs(
        self, names: Iterable[str], workers: int, cpu: Cpu, timeout_s: float
    ) -> tuple[float, float, float]:
        """gangs submits the gangs at once; returns the submit time, when all their programs
        had run and when all their pods were confirmed Running (wall clock, seconds). The
        moment every submit was answered and the programs' marks are kept in `timeline`."""
        names = sorted(names)
        pods = set().union(*(pod_names(n, workers) for n in names))
        confirmed = self.watcher.all_running({n: 1 + workers for n in names})
        cpu.begin()
        started = time.time()
        await asyncio.gather(
            *(
                self.client.submit(job(n, workers, self.command, self.marks, self.image))
                for n in names
            )
        )
        acked = time.time()
        ran = await asyncio.wait_for(all_marks(self.marks, pods), timeout_s)
        programs = ran[-1]
        self.timeline = [acked - started, *(t - started for t in ran)]
        confirmed_at = await asyncio.wait_for(confirmed, timeout_s)
        cpu.end(len(pods))
        for n in names:
            await self.client.delete(n)
        await drained(self.client)
        return started, programs, confirmed_at


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


async def measure(
    cluster: Cluster, args: argparse.Namespace, command: list[str]
) -> dict[str, object]:
    marks = cluster.root / "marks"
    marks.mkdir(mode=0o777)
    marks.chmod(0o777)  # pods may run as any user
    result: dict[str, object] = {}
    async with AsyncClient(cluster.address) as client:
        await wait_nodes(client, AGENTS)
        watcher = Watcher()
        subscribed = asyncio.Event()
        follow = asyncio.create_task(watcher.follow(client, subscribed))
        await asyncio.wait_for(subscribed.wait(), 10)
        run = Run(cluster, client, watcher, command, args.image, marks)
        await run.gangs(["warm-up"], 3, Cpu(cluster), 60)
        latency_cpu = Cpu(cluster)
        for width in args.widths:
            programs, confirmed = [], []
            for i in range(args.jobs):
                await asyncio.sleep(random.random() * args.jitter_s)
                started, ran, seen = await run.gangs([f"w{width}-{i}"], width, latency_cpu, 60)
                programs.append(ran - started)
                confirmed.append(seen - started)
            result[f"lat_W{width}"] = {
                "n": args.jobs,
                "to_all_programs_p50_s": round(percentile(programs, 0.5), 4),
                "to_all_programs_p95_s": round(percentile(programs, 0.95), 4),
                "to_all_programs_max_s": round(max(programs), 4),
                "to_confirmed_p50_s": round(percentile(confirmed, 0.5), 4),
                "to_confirmed_p95_s": round(percentile(confirmed, 0.95), 4),
            }
        result["latency_cpu"] = latency_cpu.per_pod()
        burst_cpu = Cpu(cluster)
        programs, confirmed, timelines = [], [], []
        profilers = start_profilers(cluster, args.profile) if args.profile else []
        try:
            for rep in range(args.bursts):
                await asyncio.sleep(1 + random.random() * args.jitter_s)
                names = [f"b{rep}-{i}" for i in range(BURST_GANGS)]
                started, ran, seen = await run.gangs(names, BURST_WORKERS, burst_cpu, 120)
                programs.append(ran - started)
                confirmed.append(seen - started)
                acked, *marked = run.timeline
                timelines.append(
                    {
                        "all_submits_answered_s": round(acked, 3),
                        **{
                            f"programs_{q}_s": round(percentile(marked, q / 100), 3)
                            for q in (0, 10, 50, 90, 100)
                        },
                    }
                )
        finally:
            stop_profilers(profilers)
        result["throughput"] = {
            "gangs": BURST_GANGS,
            "pods_per_gang": 1 + BURST_WORKERS,
            "reps": args.bursts,
            "all_programs_p50_s": round(statistics.median(programs), 3),
            "gangs_per_s_programs": round(BURST_GANGS / statistics.median(programs), 1),
            "all_confirmed_p50_s": round(statistics.median(confirmed), 3),
            "gangs_per_s_confirmed": round(BURST_GANGS / statistics.median(confirmed), 1),
            "per_rep_programs_s": [round(p, 3) for p in programs],
            "per_rep_timeline": timelines,
        }
        result["burst_cpu"] = burst_cpu.per_pod()
        follow.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await follow
    return result


def start_profilers(cluster: Cluster, directory: Path) -> list[subprocess.Popen[bytes]]:
    """start_profilers: py-spy on the server and each agent, until stop_profilers."""
    directory.mkdir(parents=True, exist_ok=True)
    spy = str(Path(sys.executable).parent / "py-spy")
    pids = {"server": cluster.server_pid} | {
        f"agent-{i}": pid for i, pid in enumerate(cluster.agent_pids)
    }
    profilers = []
    for name, pid in pids.items():
        command = [
            spy,
            "record",
            "-f",
            "raw",
            "-r",
            "200",
            "-o",
            str(directory / f"{name}.txt"),
            "-p",
            str(pid),
        ]
        quiet = subprocess.DEVNULL
        profilers.append(
            subprocess.Popen(command, stdout=quiet, stderr=quiet, start_new_session=True)
        )
    return profilers


def stop_profilers(profilers: list[subprocess.Popen[bytes]]) -> None:
    for proc in profilers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGINT)  # py-spy writes its file on SIGINT
    for proc in profilers:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", choices=("bash", "python"), default="bash")
    parser.add_argument("--jobs", type=int, default=10, help="gangs one after another, per width")
    parser.add_argument("--widths", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--bursts", type=int, default=3, help="bursts of 50 gangs of 1 + 3")
    parser.add_argument(
        "--jitter-s",
        type=float,
        default=1.0,
        help="a random pause of up to this long before each gang (as the Slurm peer's)",
    )
    parser.add_argument("--image", default="", help="run the pods in containers of this image")
    parser.add_argument("--profile", type=Path, help="py-spy the daemons during the bursts")
    args = parser.parse_args()
    command = PYTHON_PROGRAM if args.pods == "python" else BASH_PROGRAM
    if args.image and args.pods == "python":
        parser.error("--image runs bash pods")
    with tempfile.TemporaryDirectory(prefix="arranger-bench-") as tmp:
        os.chmod(tmp, 0o755)
        cluster = Cluster(Path(tmp), agents=AGENTS)
        cluster.start()
        try:
            result = asyncio.run(measure(cluster, args, command))
        finally:
            cluster.stop()
    result = {
        "peer": "arranger",
        "pods": args.pods + (f" in {args.image}" if args.image else ""),
        "pod_request": {"cpu": POD_CPU, "memory": POD_MEMORY},
        "agents": AGENTS,
        "cpus_per_agent": AGENT_CPUS,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "machine": f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
        **result,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
