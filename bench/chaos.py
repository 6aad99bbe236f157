"""chaos: 200 short jobs on 4 agents while the server and random agents are killed (SIGKILL) or
stopped (SIGTERM, as systemd does) and started again at random moments, then the checks that
matter:

- every job ended Succeeded or Failed, with a reason;
- no pod ever ran twice at once (each pod notes its start and end in a journal; the
  intervals of one pod name must not overlap: never two live leaders);
- no node was ever given more than it has (sampled from ListNodes through the run);
- the SQLite store passes `PRAGMA integrity_check`;
- with --real-timeouts (the default fenceTimeout 300 s and nodeTimeout 330 s, and one server
  outage of --outage-seconds, 75 by default, in the middle of the chaos): no pod was restarted
  (an agent restart or a server outage shorter than the fence kills nothing) and every job
  Succeeded.

With --standby, two arranger-servers share a PostgreSQL database (a server this benchmark
starts, as tests/postgres.py does; Debian's `postgresql` package) and the agents and clients are
given both addresses; a server fault is then always kill -9 of the active server (so the kills
alternate between the two), which is started again at once (as a standby). For each such
failover it measures the time until the other server serves (health SERVING) and until every
agent has heartbeated to it (each node's usage is known only from its agent's heartbeats), and
reports the medians; the fence is 30 s (and the node timeout 45 s), beyond a failover, so a
restart counted is a pod that a failover disturbed; the store check is then PostgreSQL's own
business.

With --mistakes, some of the faults are an operator's mistakes instead, taken in turn: the
store replaced by an empty file (the server must refuse to start, naming the file; the store is
put back and the server started again), a second agent with a node name in use (a cloned
machine: it must be refused while the first holds the name), and a second server on the same
SQLite store (it must refuse to start). Each must be refused as said, and nothing lost.

Everything is real: arranger-server processes, 4 arranger-agent processes on 127.0.0.1, pods
as shell processes. Prints one JSON object; exits 1 if a check failed.

    python bench/chaos.py [--jobs 200] [--agents 4] [--chaos-seconds 180] [--seed 1]
                          [--real-timeouts [--outage-seconds 75] | --standby] [--mistakes]
                          [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import platform
import random
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from arranger.client.sdk import ArrangerError, AsyncClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.postgres, for --standby

SERVER = {
    "schedulePeriodSeconds": 0.2,
    "heartbeatIntervalSeconds": 0.5,
    "fenceTimeoutSeconds": 6,
    "nodeTimeoutSeconds": 15,
    "killGraceSeconds": 2,
    "insecure": True,
    "httpListen": "127.0.0.1:0",
    "restartBackoffSeconds": {"initial": 0.2, "max": 2},
}
# With two servers: a fence well beyond a failover (the lease's 10 s and the agents' move),
# and a node timeout beyond the fence, as the server's config check asks.
STANDBY_TIMEOUTS = {"fenceTimeoutSeconds": 30, "nodeTimeoutSeconds": 45}
# A pod: note the start, sleep 1-6 s, note the end; a SIGTERM notes the end too.
POD = """
note() { echo "$1 $ARRANGER_POD_NAME $$ $(date +%s.%N)" >> "$JOURNAL"; }
trap 'note end; exit 143' TERM
note start
sleep "$(( $$ % 6 + 1 ))" & wait $!
note end
"""


class Daemons:
    """Daemons: the servers and agents as process groups, killed and started at will. With a
    shared `store` there are two servers, "server-a" and "server-b"; else one, "server"."""

    def __init__(
        self, root: Path, agents: int, real_timeouts: bool = False, store: str = ""
    ) -> None:
        self.root = root
        server = dict(SERVER)
        if real_timeouts:
            del server["fenceTimeoutSeconds"], server["nodeTimeoutSeconds"]
        if store:  # a failover (a lease term, agents moving) must not fence running pods
            server.update(STANDBY_TIMEOUTS)
        self.servers: dict[str, str] = {}  # name -> address
        for name in ("server-a", "server-b") if store else ("server",):
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                self.servers[name] = f"127.0.0.1:{sock.getsockname()[1]}"
            settings = {**server, "listen": self.servers[name], "dataDir": str(root / name)}
            if store:
                settings["store"] = store
            (root / f"{name}.yaml").write_text(yaml.safe_dump(settings))
        self.address = ",".join(self.servers.values())  # clients and agents get them all
        for i in range(agents):
            settings = {
                "server": self.address,
                "nodeName": f"chaos-{i}",
                "address": "127.0.0.1",
                "dataDir": str(root / f"agent-{i}"),
                "runAsRoot": True,
            }
            (root / f"agent-{i}.yaml").write_text(yaml.safe_dump(settings))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.initialised = False
        self.log = (root / "daemons.log").open("ab")

    def start(self, name: str) -> None:
        module = "arranger.server.main" if name.startswith("server") else "arranger.agent.main"
        command = [sys.executable, "-m", module, "--config", str(self.root / f"{name}.yaml")]
        if name.startswith("server") and not self.initialised:  # a new cluster's store, once
            subprocess.run([*command, "--init"], check=True, capture_output=True)
            self.initialised = True
        self.procs[name] = subprocess.Popen(
            [*command, "--log-level", "warning"],
            stdout=self.log,
            stderr=self.log,
            start_new_session=True,
        )

    def refused(self, name: str, config: Path, *extra: str) -> str:
        """refused: run the daemon `name` names with `config`, expecting it to refuse to
        start; what it said ("" if it started: it is stopped at once, and that is a miss)."""
        module = "arranger.server.main" if name.startswith("server") else "arranger.agent.main"
        command = [sys.executable, "-m", module, "--config", str(config), *extra]
        try:
            ran = subprocess.run(command, check=False, capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            return ""
        return (ran.stdout + ran.stderr).strip() if ran.returncode != 0 else ""

    def kill(self, name: str, sig: signal.Signals = signal.SIGKILL) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            proc.wait(timeout=60)

    def stop_all(self) -> None:
        for name in [n for n in self.procs if not n.startswith("server")]:
            self.kill(name, signal.SIGTERM)  # the agent alone: its pods would run on
        for name in self.servers:
            self.kill(name, signal.SIGTERM)
        for record in self.root.glob("agent-*/runs/*/*.json"):  # whatever still runs
            with contextlib.suppress(OSError, ValueError, KeyError):
                os.killpg(int(json.loads(record.read_text())["pid"]), signal.SIGKILL)
        self.log.close()

    async def active(self) -> str:
        """active: the name of the server that serves now ("" if none does)."""
        for name, address in self.servers.items():
            if await serving(address):
                return name
        return ""


async def serving(address: str) -> bool:
    """serving: the server at `address` answers health checks SERVING (active, loaded)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
        except grpc.aio.AioRpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


async def failover(daemons: Daemons, rng: random.Random) -> dict[str, float]:
    """failover kills the active server (-9) and starts it again at once (a standby, which
    competes with the other for the lease when it lapses), and measures how long until a server
    serves again and until every agent has heartbeated to it."""
    victim = await daemons.active()
    if not victim:
        return {}
    killed = time.monotonic()
    daemons.kill(victim, signal.SIGKILL)
    await asyncio.sleep(rng.uniform(0.2, 1.0))
    daemons.start(victim)
    deadline = killed + 120
    while not (active := await daemons.active()):
        if time.monotonic() > deadline:
            raise RuntimeError("no server took over")
        await asyncio.sleep(0.05)
    took_over = time.monotonic() - killed
    async with AsyncClient(daemons.servers[active], timeout_s=5) as client:
        while True:
            with contextlib.suppress(ArrangerError):
                nodes = await client.nodes()
                if nodes and all(n.usage.memory_used > 0 for n in nodes):
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("the agents did not come to the new server")
            await asyncio.sleep(0.1)
    return {
        "takeover_s": took_over,
        "agents_back_s": time.monotonic() - killed,
        "same_server": float(active == victim),
    }


async def wait_serving(address: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        with contextlib.suppress(ArrangerError):
            async with AsyncClient(address, timeout_s=2) as client:
                await client.jobs()
                return
        await asyncio.sleep(0.1)
    raise RuntimeError("the server did not come back")


def job(name: str, journal: Path) -> dict[str, Any]:
    template = {
        "command": ["/bin/sh", "-c", POD],
        "env": {"JOURNAL": str(journal)},
        "resources": {"cpu": 0.2, "memory": "32Mi"},
    }
    return {
        "apiVersion": "arranger/v1",
        "kind": "TYJob",
        "metadata": {"name": name},
        "spec": {
            "restartLimit": 5,
            "minWorkersNum": 1,
            "leader": {"name": "learner", "template": template},
            "workerSets": [{"name": "actors", "counts": 2, "template": template}],
        },
    }


async def empty_store(daemons: Daemons) -> str:
    """empty_store ("" if all went as it must, else what did not): the server is stopped, its store replaced by an empty file (a copy onto a
    full disk) and started: it must refuse, naming the file. Then the store is put back and the
    server started, within a fence timeout: nothing may be lost."""
    data = daemons.root / "server"
    daemons.kill("server", signal.SIGTERM)
    files = [data / f"arranger.db{suffix}" for suffix in ("", "-wal", "-shm")]
    for file in files:
        if file.exists():
            file.rename(file.with_name(file.name + ".saved"))
    files[0].touch(mode=0o600)
    said = await asyncio.to_thread(daemons.refused, "server", daemons.root / "server.yaml")
    files[0].unlink()
    for file in files:
        saved = file.with_name(file.name + ".saved")
        if saved.exists():
            saved.rename(file)
    daemons.start("server")
    await wait_serving(daemons.address, time.monotonic() + 30)
    return "" if f"store {files[0]} is empty" in said else f"empty store: said {said!r}"


async def twin_server(daemons: Daemons) -> str:
    """twin_server: a second server on the running server's SQLite store must refuse."""
    settings = yaml.safe_load((daemons.root / "server.yaml").read_text())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        settings["listen"] = f"127.0.0.1:{sock.getsockname()[1]}"
    config = daemons.root / "twin-server.yaml"
    config.write_text(yaml.safe_dump(settings))
    said = await asyncio.to_thread(daemons.refused, "server", config)
    return "" if "another arranger-server" in said else f"twin server: said {said!r}"


async def twin_agent(daemons: Daemons, seconds: float = 4.0) -> str:
    """twin_agent: a second agent named as chaos-0 (a cloned machine) runs for a while; the
    server must refuse it (its log says so) and chaos-0 keep its pods."""
    settings = yaml.safe_load((daemons.root / "agent-0.yaml").read_text())
    settings["dataDir"] = str(daemons.root / "twin-agent")
    config = daemons.root / "twin-agent.yaml"
    config.write_text(yaml.safe_dump(settings))
    log = daemons.root / "twin-agent.log"
    with log.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "arranger.agent.main",
            "--config",
            str(config),
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
        try:
            await asyncio.sleep(seconds)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 60)
    said = log.read_text()
    return "" if "is held by another agent" in said else f"twin agent: said {said[-300:]!r}"


MISTAKES = {"empty_store": empty_store, "twin_server": twin_server, "twin_agent": twin_agent}


async def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    journal = root / "journal"
    postgres = None
    if args.standby:
        from tests.postgres import postgres_server  # noqa: PLC0415 (only with --standby)

        postgres = contextlib.ExitStack()
        store = postgres.enter_context(postgres_server()).new_database()
    daemons = Daemons(root, args.agents, args.real_timeouts, store if args.standby else "")
    failovers: list[dict[str, float]] = []
    agents = [f"agent-{i}" for i in range(args.agents)]
    kills: collections.Counter[str] = collections.Counter()
    overallocated: list[str] = []
    samples = 0
    # Per mistake, "" each time it was refused as it must be, else what was seen instead.
    mistakes: dict[str, list[str]] = {name: [] for name in MISTAKES} if args.mistakes else {}
    try:
        for name in daemons.servers:
            daemons.start(name)
        await wait_serving(daemons.address, time.monotonic() + 60)
        for name in agents:
            daemons.start(name)
        names = [f"chaos-{n}" for n in range(args.jobs)]
        pending = list(names)

        async def submit_some(count: int) -> None:
            while pending and count:
                name = pending[0]
                try:
                    async with AsyncClient(daemons.address, timeout_s=5) as client:
                        await client.submit(job(name, journal))
                except ArrangerError as exc:
                    if "exists" not in exc.message:
                        return  # the server is down: try again later
                pending.pop(0)
                count -= 1

        async def sample() -> None:
            nonlocal samples
            with contextlib.suppress(ArrangerError):
                async with AsyncClient(daemons.address, timeout_s=2) as client:
                    for node in await client.nodes():
                        cap, got = node.capacity, node.allocated
                        if got.cpu > cap.cpu + 1e-6 or got.memory > cap.memory:
                            overallocated.append(f"{node.name}: {got} of {cap}")
                    samples += 1

        started = time.monotonic()
        chaos_end = started + args.chaos_seconds
        next_fault = started + rng.uniform(3, 10)
        outage_at = started + args.chaos_seconds / 2 if args.real_timeouts else float("inf")
        while time.monotonic() < chaos_end or pending:
            # Jobs arrive through the first 80 % of the chaos, so faults hit running jobs.
            share = (time.monotonic() - started) / (0.8 * args.chaos_seconds)
            due = min(len(names), int(len(names) * share) + 1)
            await submit_some(due - (len(names) - len(pending)))
            await sample()
            if time.monotonic() >= outage_at:  # the head node is down for minutes
                outage_at = float("inf")
                daemons.kill("server", signal.SIGTERM)
                kills["server_outage"] += 1
                await asyncio.sleep(args.outage_seconds)
                daemons.start("server")
                await wait_serving(daemons.address, time.monotonic() + 30)
            if mistakes and time.monotonic() >= next_fault and rng.random() < 0.4:
                name = min(mistakes, key=lambda m: len(mistakes[m]))  # each in turn
                mistakes[name].append(await MISTAKES[name](daemons))
                next_fault = time.monotonic() + rng.uniform(3, 12)
                continue
            if time.monotonic() >= next_fault and time.monotonic() < chaos_end:
                victim = "server" if rng.random() < 0.35 else rng.choice(agents)
                if victim == "server" and args.standby:
                    measured = await failover(daemons, rng)
                    if measured:
                        failovers.append(measured)
                        kills["server_failover"] += 1
                    next_fault = time.monotonic() + rng.uniform(3, 12)
                    continue
                how = (
                    signal.SIGTERM if victim != "server" and rng.random() < 0.5 else signal.SIGKILL
                )
                daemons.kill(victim, how)
                kills[f"{victim.split('-')[0]}_{how.name}"] += 1
                await asyncio.sleep(rng.uniform(0.2, 3.0))  # down for a moment
                daemons.start(victim)
                if victim == "server":
                    await wait_serving(daemons.address, time.monotonic() + 30)
                next_fault = time.monotonic() + rng.uniform(3, 12)
            await asyncio.sleep(0.3)

        # Calm: wait until every job has ended.
        deadline = time.monotonic() + args.settle_seconds
        stages: dict[str, Any] = {}
        while time.monotonic() < deadline:
            await sample()
            with contextlib.suppress(ArrangerError):
                async with AsyncClient(daemons.address, timeout_s=10) as client:
                    stages = {j.name: j.progress for j in await client.jobs()}
            if len(stages) == len(names) and all(
                s.stage in ("Succeeded", "Failed") for s in stages.values()
            ):
                break
            await asyncio.sleep(1)
    finally:
        daemons.stop_all()
        if postgres is not None:
            postgres.close()

    outcome = collections.Counter(f"{s.stage}: {s.reason}" for s in stages.values())
    unfinished = [
        n for n in names if n not in stages or stages[n].stage not in ("Succeeded", "Failed")
    ]
    without_reason = [n for n, s in stages.items() if s.stage == "Failed" and not s.reason]
    restarts = sum(s.restarts for s in stages.values())
    failed = sum(1 for s in stages.values() if s.stage != "Succeeded")
    overlaps = overlapping(journal)
    integrity = "ok (PostgreSQL)"
    if not args.standby:
        with contextlib.closing(sqlite3.connect(root / "server" / "arranger.db")) as db:
            integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
    ok = not unfinished and not without_reason and not overlaps and not overallocated
    if args.mistakes:  # each made at least once, and each time refused as it must be
        ok = ok and all(tries and not any(tries) for tries in mistakes.values())
    if args.real_timeouts:
        ok = ok and restarts == 0 and failed == 0
    return {
        "ok": ok and integrity.startswith("ok"),
        "jobs": len(names),
        "outcomes": dict(outcome.most_common()),
        "unfinished": unfinished[:10],
        "failed_without_reason": without_reason[:10],
        "kills": dict(kills),
        "failovers": len(failovers),
        "takeover_s_median": _median([f["takeover_s"] for f in failovers]),
        "agents_back_s_median": _median([f["agents_back_s"] for f in failovers]),
        "agents_back_s_max": max((f["agents_back_s"] for f in failovers), default=None),
        "taken_over_by_the_other": sum(1 for f in failovers if not f["same_server"]),
        "restarts": restarts,
        "mistakes_refused": {n: f"{t.count('')}/{len(t)}" for n, t in mistakes.items()},
        "mistakes_missed": [miss for tries in mistakes.values() for miss in tries if miss],
        "real_timeouts": args.real_timeouts,
        "outage_seconds": args.outage_seconds if args.real_timeouts else 0,
        "pods_started": sum(
            1 for line in journal.read_text().splitlines() if line.startswith("start")
        )
        if journal.exists()
        else 0,
        "concurrent_runs_of_one_pod": overlaps[:10],
        "node_samples": samples,
        "overallocated": overallocated[:10],
        "integrity_check": integrity,
        "chaos_seconds": args.chaos_seconds,
        "machine": f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
    }


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def overlapping(journal: Path) -> list[str]:
    """overlapping: pods of which two runs (two pids) were alive at the same time. A run with
    no end noted (killed outright) counts as running until the next note of the same pod."""
    if not journal.exists():
        return []
    notes: dict[str, list[tuple[float, str, str]]] = collections.defaultdict(list)
    for line in journal.read_text().splitlines():
        parts = line.split()
        if len(parts) == 4:
            what, pod, pid, when = parts
            notes[pod].append((float(when), what, pid))
    found = []
    for pod, events in notes.items():
        alive: set[str] = set()
        for _, what, pid in sorted(events):
            if what == "start":
                if alive - {pid}:
                    found.append(f"{pod}: {sorted(alive)} and {pid}")
                alive = {pid}
            else:
                alive.discard(pid)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--chaos-seconds", type=float, default=180)
    parser.add_argument("--settle-seconds", type=float, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--real-timeouts",
        action="store_true",
        help="the default fence and node timeouts, and one long server outage",
    )
    parser.add_argument("--outage-seconds", type=float, default=75)
    parser.add_argument(
        "--keep", metavar="DIR", help="run in DIR and keep it (journal, logs) for a look after"
    )
    parser.add_argument(
        "--standby",
        action="store_true",
        help="two servers on a shared PostgreSQL store; server faults kill the active one",
    )
    parser.add_argument(
        "--mistakes",
        action="store_true",
        help="some faults are an operator's mistakes: an emptied store, a twin agent, a twin server",
    )
    args = parser.parse_args()
    if args.standby and args.real_timeouts:
        parser.error("--standby and --real-timeouts are measured apart")
    if args.mistakes and args.standby:
        parser.error("--mistakes are made on a SQLite store, not with --standby")
    # SIGTERM ends the run as Ctrl-C does: what it started (daemons, pods, PostgreSQL) stops.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="arranger-chaos-") as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        result = asyncio.run(run(args, root))
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
