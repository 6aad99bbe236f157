"""swarm: one real arranger-server and N simulated agents: what the server spends on them.

For each N, starts arranger-server (insecure, on 127.0.0.1, its SQLite store in a temporary
directory) pinned to one core, and N simulated agents (bench/swarm_agent.py: the real
AgentService protocol, a connection each, nodes of 64 cores, 512 GiB and 8 GPUs) pinned with
this process to another, so that the server's figures are its own. Then, through the real API:

- registration: every agent connects at once; the time until all got Registered and until
  ListNodes shows N Ready, the server's CPU seconds meanwhile, and the streams that broke;
- idle: the server's CPU (cores) with N agents heartbeating and no jobs, over --idle-s or the
  longest heartbeat period the server tells N agents if that is longer, after one such period
  (the period stretches with N, and the agents take it from every HeartbeatAck, as the real
  agent does);
- silence: one agent stops sending but keeps its stream, another closes its stream; the time
  from the last message each sent (register, heartbeat or report) until ListNodes shows its
  node NotReady, against the node timeout the server uses for N agents (nodeTimeoutSeconds is
  set to --node-timeout-s, which the server's config check must accept, and stretched);
- submits: jobs of 1 leader + 3 workers at --submit-rate for --submit-s, open loop: latency
  p50/p99, the server's CPU-ms per submit over the submit window, and the time until every job
  is Running (all four pods Running, agent-confirmed); then the idle CPU again, with the jobs.

The server's CPU time and RSS are read from /proc/<pid>/stat and /proc/<pid>/status. Prints
one JSON line per N, then a table. Per-phase lists (`phases_s`, `stream_errors_by_phase`,
`swarm_loop_lag_ms_by_phase`) follow the order above; the swarm's event-loop lag says whether
the swarm, rather than the server, held things up. Exits 1 unless every job was placed.
Everything started is stopped, even on error, Ctrl-C or SIGTERM.

    python bench/swarm.py [--agents 100,1000,5000] [--idle-s 10] [--submit-rate 100]
                          [--submit-s 10] [--quick] [--profile DIR] [--log-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from rich.console import Console
from rich.table import Table
from swarm_procs import MIB, Profiler, Server, Swarm, cpu_s, rss_mib  # bench/, run as a script

from arranger.client.sdk import ArrangerError, AsyncClient, as_job
from arranger.server import heartbeats
from arranger.server.collector import Collector
from arranger.server.config import ConfigError
from arranger.v1 import arranger_pb2, arranger_pb2_grpc, job_pb2

POLL_S = 0.25
QUIET_POLL_S = 10.0  # how often ListNodes is asked while nothing is due: it costs the server
# ListNodes of many thousand nodes outgrows gRPC's default 4 MiB a message.
NODES_CHANNEL = [("grpc.max_receive_message_length", 512 * MIB)]


async def until(
    check: Callable[[], Awaitable[bool]], timeout_s: float, what: str, quiet_until: float = 0.0
) -> float:
    """until polls `check` every POLL_S (every QUIET_POLL_S before `quiet_until`, a
    time.monotonic()) and returns the time.monotonic() it first held."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        now = time.monotonic()
        if now > deadline:
            raise RuntimeError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(POLL_S if now >= quiet_until else min(QUIET_POLL_S, quiet_until - now))
    return time.monotonic()


def job(name: str) -> dict[str, object]:
    """job: 1 leader + 3 workers, small enough that thousands fit; Running means all four run."""
    template = {"command": ["sleep", "3600"], "resources": {"cpu": "100m", "memory": "64Mi"}}
    return {
        "metadata": {"name": name},
        "spec": {
            "minWorkersNum": 3,
            "leader": {"name": "learner", "template": template},
            "workerSets": [{"name": "actors", "counts": 3, "template": template}],
        },
    }


def percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class Bench:
    """Bench measures one N against a server and swarms already started."""

    def __init__(self, n: int, server: Server, swarms: list[Swarm], args: argparse.Namespace):
        self.n = n
        self.server = server
        self.swarms = swarms
        self.args = args
        self.result: dict[str, Any] = {"agents": n, "swarm_procs": len(swarms)}
        self.profiler = Profiler(args.profile, args.swarm_cpu)
        self.channel = grpc.aio.insecure_channel(server.address, options=NODES_CHANNEL)
        self.stub = arranger_pb2_grpc.ArrangerStub(self.channel)
        self.swarm_lag_ms = 0  # the swarm's longest event-loop delay since it was last read

    def swarm_cpu_s(self) -> float:
        return sum(cpu_s(s.proc.pid) for s in self.swarms)

    async def stats(self) -> dict[str, Any]:
        total: dict[str, Any] = {}
        for swarm in self.swarms:
            for key, value in (await swarm.ask(cmd="stats")).items():
                if isinstance(value, int):
                    total[key] = total.get(key, 0) + value
                elif isinstance(value, list):
                    total.setdefault(key, []).extend(value)
                elif isinstance(value, dict):
                    merged = total.setdefault(key, Counter())
                    merged.update(value)
        self.swarm_lag_ms = max(self.swarm_lag_ms, *total["loop_lags_ms"])
        return total

    async def node_states(self) -> dict[str, str]:
        reply = await self.stub.ListNodes(arranger_pb2.ListNodesRequest(), timeout=120)
        return {node.name: node.state for node in reply.nodes}

    async def registration(self) -> None:
        args, pid, r = self.args, self.server.pid, self.result
        self.profiler.start(pid, f"register-{self.n}")
        cpu0, swarm0, t0 = cpu_s(pid), self.swarm_cpu_s(), time.monotonic()
        for swarm in self.swarms:
            await swarm.send(cmd="connect")
        try:
            done = [await s.event("registered", args.register_timeout_s) for s in self.swarms]
        except RuntimeError:
            stats = await self.stats()
            raise RuntimeError(
                f"not every agent registered within {args.register_timeout_s:g} s: {stats}"
            ) from None
        registered_at = max(d["last"] for d in done)

        async def all_ready() -> bool:
            states = await self.node_states()
            return sum(state == "Ready" for state in states.values()) == self.n

        ready_at = await until(all_ready, args.register_timeout_s, f"{self.n} nodes Ready")
        cpu1 = cpu_s(pid)
        self.profiler.stop()
        started = time.perf_counter()
        reply = await self.stub.ListNodes(arranger_pb2.ListNodesRequest(), timeout=120)
        r["list_nodes_ms"] = round((time.perf_counter() - started) * 1000, 1)
        r["list_nodes_mib"] = round(reply.ByteSize() / MIB, 2)  # the SDK's channel takes 4
        r["registered"] = sum(d["agents"] for d in done)
        r["register_s"] = round(registered_at - t0, 3)
        r["ready_s"] = round(ready_at - t0, 3)
        r["register_server_cpu_s"] = round(cpu1 - cpu0, 2)
        r["register_server_cpu_ms_per_agent"] = round((cpu1 - cpu0) * 1000 / self.n, 2)
        r["register_swarm_cpu_s"] = round(self.swarm_cpu_s() - swarm0, 2)
        r["rss_registered_mib"] = rss_mib(pid)

    def period_s(self) -> float:
        """period_s: the longest heartbeat period the server tells N agents (they stretch with
        the number of agents, arranger.server.heartbeats)."""
        return heartbeats.longest(heartbeats.period(self.n, self.server.settings))

    async def idle(self, key: str) -> None:
        """idle: the server's CPU over --idle-s, or over the longest heartbeat period if that is
        longer (agents that registered together heartbeat in waves: a shorter window could
        fall between two), after one such period to settle: by then every agent has taken the
        period its acks name (those that registered first were told a shorter one)."""
        await asyncio.sleep(self.period_s())
        pid = self.server.pid
        self.profiler.start(pid, f"{key}-{self.n}")
        before, cpu0, t0 = await self.stats(), cpu_s(pid), time.monotonic()
        swarm0 = self.swarm_cpu_s()
        await asyncio.sleep(max(self.args.idle_s, self.period_s()))
        cpu1, t1, swarm1 = cpu_s(pid), time.monotonic(), self.swarm_cpu_s()
        after = await self.stats()
        self.profiler.stop()
        self.result[f"{key}_server_cores"] = round((cpu1 - cpu0) / (t1 - t0), 4)
        self.result[f"{key}_swarm_cores"] = round((swarm1 - swarm0) / (t1 - t0), 4)
        self.result[f"{key}_acks_per_s"] = round((after["acks"] - before["acks"]) / (t1 - t0), 1)

    async def silence(self) -> None:
        """silence: the last agent goes quiet on its open stream, the one before closes it; each
        is timed from the last message it sent (its register, a heartbeat or a report) until
        ListNodes shows its node NotReady. The server waits its node timeout, stretched with
        the number of agents (arranger.server.heartbeats): ListNodes is asked rarely until
        then, so that listing thousands of nodes does not load the server being measured."""
        swarm, last = self.swarms[-1], self.n - 1
        quiet, closed = f"swarm-{last:05d}", f"swarm-{last - 1:05d}"
        said = {
            quiet: await swarm.ask(cmd="silence", node=quiet, mode="connected"),
            closed: await swarm.ask(cmd="silence", node=closed, mode="closed"),
        }
        settings = self.server.settings
        effective = heartbeats.node_timeout(heartbeats.period(self.n, settings), settings)
        due = min(s["last_sent"] for s in said.values()) + effective
        noticed: dict[str, float] = {}

        async def both_not_ready() -> bool:
            states = await self.node_states()
            for name in said:
                if states.get(name) == "NotReady" and name not in noticed:
                    noticed[name] = time.monotonic()
            return len(noticed) == len(said)

        timeout = due - time.monotonic() + 2 * self.period_s() + 30
        await until(both_not_ready, timeout, "the silenced nodes to be NotReady", due - 1)
        for name, key in ((quiet, "silent_connected"), (closed, "silent_closed")):
            self.result[f"{key}_notice_s"] = round(noticed[name] - said[name]["last_sent"], 2)
        self.result["heartbeat_period_s"] = round(self.period_s(), 1)  # the longest told
        self.result["node_timeout_s"] = round(effective, 1)  # as stretched for N agents
        self.result["fence_timeout_s"] = self.server.fence_s

    async def submits(self, client: AsyncClient) -> None:
        args, pid, r = self.args, self.server.pid, self.result
        total = round(args.submit_rate * args.submit_s)
        latencies: list[float] = []
        acknowledged: list[str] = []
        refused: list[str] = []
        refused_at: list[float] = []  # seconds after the first submit

        async def submit(message: job_pb2.TYJob) -> None:
            name = message.metadata.name
            started = time.perf_counter()
            try:
                await client.submit(message)
            except ArrangerError as exc:
                refused.append(f"{name}: {exc.code.name} {exc.message}")
                refused_at.append(time.monotonic() - t0)
                return
            latencies.append(time.perf_counter() - started)
            acknowledged.append(name)

        messages = [as_job(job(f"swarm-job-{i}")) for i in range(total)]  # before the clock runs
        self.profiler.start(pid, f"submits-{self.n}")
        cpu0, t0, lag = cpu_s(pid), time.monotonic(), 0.0
        tasks = []
        for i, message in enumerate(messages):
            delay = t0 + i / args.submit_rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            lag = max(lag, -delay)
            tasks.append(asyncio.create_task(submit(message)))
        await asyncio.gather(*tasks)
        acked_at, cpu1 = time.monotonic(), cpu_s(pid)
        self.profiler.stop()
        wanted = set(acknowledged)

        async def all_running() -> bool:
            running = await client.jobs(stages=["Running"])
            return wanted <= {j.name for j in running if j.progress.running_workers == 3}

        placed_at = await until(all_running, args.place_timeout_s, "every job to be Running")
        ordered = sorted(latencies)
        r["submits"], r["acknowledged"], r["refused"] = total, len(acknowledged), len(refused)
        r["refusals"] = refused[:3]
        if refused_at:
            r["refused_from_to_s"] = [round(min(refused_at), 2), round(max(refused_at), 2)]
        r["submit_rate_achieved"] = round(len(acknowledged) / (acked_at - t0), 1)
        r["submit_schedule_lag_ms"] = round(lag * 1000, 1)
        r["submit_p50_ms"] = round(percentile(ordered, 0.5) * 1000, 1)
        r["submit_p99_ms"] = round(percentile(ordered, 0.99) * 1000, 1)
        r["submit_max_ms"] = round(ordered[-1] * 1000, 1) if ordered else None
        per_submit = (cpu1 - cpu0) * 1000 / max(1, len(acknowledged))
        r["server_cpu_ms_per_submit"] = round(per_submit, 2)
        idle_ms = r["idle_server_cores"] * (acked_at - t0) * 1000 / max(1, len(acknowledged))
        r["server_cpu_ms_per_submit_above_idle"] = round(per_submit - idle_ms, 2)
        r["placed"] = len(wanted)
        r["placed_s_after_last_ack"] = round(placed_at - acked_at, 2)
        r["placed_s_after_first_submit"] = round(placed_at - t0, 2)
        r["server_cpu_ms_per_job_placed"] = round(
            (cpu_s(pid) - cpu0) * 1000 / max(1, len(acknowledged)), 2
        )

    async def run(self) -> dict[str, Any]:
        async with AsyncClient(self.server.address, timeout_s=120) as client:
            phases: list[Callable[[], Awaitable[None]]] = [
                self.registration,
                lambda: self.idle("idle"),
                self.silence,
                lambda: self.submits(client),
                lambda: self.idle("idle_with_jobs"),
            ]
            took, errors, lags = [], [], []
            for phase in phases:
                started = time.monotonic()
                await phase()
                took.append(round(time.monotonic() - started, 1))
                errors.append((await self.stats())["stream_errors"])
                lags.append(self.swarm_lag_ms)
                self.swarm_lag_ms = 0
            self.result["phases_s"] = took
            self.result["stream_errors_by_phase"] = errors
            self.result["swarm_loop_lag_ms_by_phase"] = lags
        stats = await self.stats()
        r = self.result
        request = arranger_pb2.ListEventsRequest(limit=100_000)
        kinds = Counter(e.kind for e in (await self.stub.ListEvents(request, timeout=120)).events)
        r["node_ready_events"], r["node_lost_events"] = kinds["NodeReady"], kinds["NodeLost"]
        r["rss_end_mib"] = rss_mib(self.server.pid)
        r["launches"] = stats["launches"]
        r["reconnects"], r["stream_errors"] = stats["reconnects"], stats["stream_errors"]
        r["stream_error_codes"] = dict(stats.get("codes", {}))
        r["agent_errors"] = stats.get("errors", [])[:3]
        return r

    async def close(self) -> None:
        self.profiler.stop()
        await self.channel.close()


async def serving(address: str, timeout_s: float) -> None:
    async def up() -> bool:
        try:
            async with AsyncClient(address, timeout_s=2) as client:
                await client.jobs()
                return True
        except ArrangerError:
            return False

    await until(up, timeout_s, f"arranger-server at {address}")


async def interruptible(work: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """interruptible: SIGINT or SIGTERM cancels `work`, whose cleanup then runs (whatever
    signal dispositions this process inherited)."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    return await work


def keep_logs(root: Path, log_dir: Path, n: int) -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    for log in root.glob("*.log"):
        shutil.copy(log, log_dir / f"{n}-{log.name}")


async def measure(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """measure starts a server and the swarm for N agents, measures, and stops them all."""
    with tempfile.TemporaryDirectory(prefix="arranger-swarm-") as tmp:
        root = Path(tmp)
        server = Server(root, args, round(args.submit_rate * args.submit_s))
        swarms: list[Swarm] = []
        bench: Bench | None = None
        try:
            await server.init()
            server.start()
            await serving(server.address, 60)
            procs = max(1, min(args.swarm_procs, n))
            for k in range(procs):
                first, last = n * k // procs, n * (k + 1) // procs
                swarms.append(await Swarm.start(root, server.address, first, last - first, args))
            for swarm in swarms:
                await swarm.event("ready", 120)
            bench = Bench(n, server, swarms, args)
            result = await bench.run()
            result["server_alive"] = server.proc is not None and server.proc.poll() is None
            return result
        except BaseException:
            log = root / "server.log"
            if log.exists():  # what the server said is lost with the directory
                sys.stderr.write(log.read_text()[-4000:])
            raise
        finally:
            if bench is not None:
                await bench.close()
            for swarm in swarms:
                await swarm.stop()
            server.stop()
            if args.log_dir is not None:
                keep_logs(root, args.log_dir, n)


ROWS = [
    ("registered", "agents registered"),
    ("register_s", "all Registered (s)"),
    ("ready_s", "ListNodes: all Ready (s)"),
    ("register_server_cpu_s", "server CPU, registration (s)"),
    ("register_server_cpu_ms_per_agent", "server CPU-ms per registration"),
    ("register_swarm_cpu_s", "swarm CPU, registration (s)"),
    ("rss_registered_mib", "server RSS registered (MiB)"),
    ("list_nodes_ms", "one ListNodes (ms)"),
    ("list_nodes_mib", "one ListNodes (MiB)"),
    ("idle_server_cores", "idle server (cores)"),
    ("idle_swarm_cores", "idle swarm (cores)"),
    ("heartbeat_period_s", "longest heartbeat period (s)"),
    ("idle_acks_per_s", "heartbeats acked /s"),
    ("node_timeout_s", "node timeout, stretched (s)"),
    ("silent_connected_notice_s", "silent, connected: NotReady after (s)"),
    ("silent_closed_notice_s", "stream closed: NotReady after (s)"),
    ("submit_rate_achieved", "submits /s achieved"),
    ("submit_schedule_lag_ms", "submit loop behind (ms)"),
    ("submit_p50_ms", "submit p50 (ms)"),
    ("submit_p99_ms", "submit p99 (ms)"),
    ("server_cpu_ms_per_submit", "server CPU-ms per submit"),
    ("node_lost_events", "NodeLost events (2 silenced)"),
    ("node_ready_events", "NodeReady events (rejoins)"),
    ("placed", "jobs placed (all 4 pods Running)"),
    ("placed_s_after_last_ack", "all Running after last submit (s)"),
    ("idle_with_jobs_server_cores", "idle server with the jobs (cores)"),
    ("rss_end_mib", "server RSS at end (MiB)"),
]


def table(results: list[dict[str, Any]]) -> Table:
    out = Table("measure", *(f"N = {r['agents']:,}" for r in results))
    for key, label in ROWS:
        out.add_row(label, *(str(r.get(key, "-")) for r in results))
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--agents", action="append", default=[], help="N (repeatable, or a comma list; default 100)"
    )
    p.add_argument("--idle-s", type=float, help="idle window (default 10; quick 1)")
    p.add_argument("--submit-rate", type=float, help="submits per second (default 100; quick 20)")
    p.add_argument("--submit-s", type=float, help="submit window (default 10; quick 1)")
    p.add_argument("--heartbeat-s", type=float, help="heartbeatIntervalSeconds (5; quick 0.5)")
    p.add_argument("--node-timeout-s", type=float, help="nodeTimeoutSeconds (20; quick 2)")
    p.add_argument("--resync-s", type=float, default=30.0, help="agents' full reports (30)")
    p.add_argument(
        "--usage-s",
        type=float,
        default=5.0,
        help="agents' usage reports of their running pods (5, the agent's default; 0: none)",
    )
    p.add_argument("--quick", action="store_true", help="short windows and timeouts (smoke)")
    p.add_argument("--swarm-procs", type=int, default=1, help="processes the agents share")
    p.add_argument("--server-cpu", type=int, help="the server's core (default: the first)")
    p.add_argument("--swarm-cpu", type=int, help="the swarm's core (default: the second)")
    p.add_argument("--no-pin", action="store_true", help="run everything on any core")
    p.add_argument("--register-timeout-s", type=float, default=900.0)
    p.add_argument("--place-timeout-s", type=float, default=600.0)
    p.add_argument("--profile", type=Path, help="write py-spy profiles of the server here")
    p.add_argument("--log-dir", type=Path, help="keep the server's and the swarm's logs here")
    args = p.parse_args(argv)
    quick = {
        "idle_s": 1.0,
        "submit_rate": 20.0,
        "submit_s": 1.0,
        "heartbeat_s": 0.5,
        "node_timeout_s": 2.0,
    }
    full = {
        "idle_s": 10.0,
        "submit_rate": 100.0,
        "submit_s": 10.0,
        "heartbeat_s": 5.0,
        "node_timeout_s": 20.0,
    }
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.agents = [int(n) for a in args.agents or ["100"] for n in a.split(",") if n]
    cores = sorted(os.sched_getaffinity(0))
    if args.no_pin or len(cores) < 2:
        args.server_cpu = args.swarm_cpu = None
    else:
        args.server_cpu = cores[0] if args.server_cpu is None else args.server_cpu
        args.swarm_cpu = cores[1] if args.swarm_cpu is None else args.swarm_cpu
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.swarm_cpu is not None:
        os.sched_setaffinity(0, {args.swarm_cpu})  # this process submits and lists: not the server
    Collector().install()  # its own collections would count as the server's latency
    machine = f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"
    results = []
    for n in args.agents:
        try:
            result = asyncio.run(interruptible(measure(n, args)))
        except ConfigError as exc:
            print(f"error: the server refuses these settings: {exc}", file=sys.stderr)
            return 1
        except asyncio.CancelledError:
            print("interrupted: everything it started is stopped", file=sys.stderr)
            return 130
        result["load_avg_1m"] = round(os.getloadavg()[0], 2)
        result["machine"] = machine
        results.append(result)
        print(json.dumps(result), flush=True)
    Console(width=120).print(table(results))
    ok = all(
        r["placed"] == r["acknowledged"] == r["submits"] and r["server_alive"] for r in results
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
