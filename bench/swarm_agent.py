"""swarm_agent: many simulated arranger agents in one asyncio process, driven by bench/swarm.py.

Each simulated agent speaks the real AgentService protocol on a gRPC channel of its own (its
own TCP connection, as separate machines would, with the real agent's keepalive): it registers
with a node's cores, memory and GPUs, sends a heartbeat one period after the last, the period
the server last named (in Registered or in any HeartbeatAck: it stretches as the cluster grows,
and each node's is staggered by the server), sends its full pod list every resync period,
answers every launch with a Running report and every kill with a Killed one, and reconnects with
the real agent's back-off when its stream breaks, all as the real agent (arranger/agent) does.
It starts no process.

The process is driven over stdin and stdout, one JSON object a line:

    in:  {"cmd": "connect"}    every agent connects at once; "registered" follows when all have
         {"cmd": "silence", "node": NAME, "mode": "connected" | "closed"}
              connected: its heartbeats and resyncs stop, its stream stays open;
              closed: its stream closes and it never reconnects
         {"cmd": "stats"}      counters since start
         {"cmd": "stop"}       (or end of input) every agent stops, then the process exits
    out: {"event": "ready"}, {"event": "registered", ...}, {"event": "silenced", ...},
         {"event": "stats", ...}
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import grpc

from arranger.agent.agent import KEEPALIVE, resync_period_s
from arranger.agent.servers import RECONNECT_FIRST_S, RECONNECT_RESET_S, reconnect_delay
from arranger.server.collector import Collector
from arranger.v1 import agent_pb2, agent_pb2_grpc, node_pb2

GI = 2**30
# The real agent's keepalive, and a subchannel per channel: gRPC would otherwise share one TCP
# connection among all channels to the same address.
CHANNEL_OPTIONS = [*KEEPALIVE, ("grpc.use_local_subchannel_pool", 1)]
RECONNECT_MAX_S = 10.0  # the real agent's reconnect_max_s
DEFAULT_PERIOD_S = 5.0  # the real agent's heartbeat_interval_s, until the server names one
FIRST_PORT = 20_000  # ports "allocated" to pods; nothing listens on them
LAG_TICK_S = 0.1


@dataclass(frozen=True)
class NodeShape:
    """NodeShape is what every simulated node declares."""

    cores: int = 64
    memory_gib: int = 512
    gpus: int = 8
    gpu_model: str = "A100"
    gpu_memory_gib: int = 80


@dataclass
class Counters:
    """Counters are shared by every agent of the process; errors keep the first few texts."""

    registrations: int = 0
    reconnects: int = 0
    heartbeats: int = 0
    acks: int = 0
    resyncs: int = 0
    launches: int = 0
    kills: int = 0
    log_requests: int = 0
    usage_reports: int = 0
    stream_errors: int = 0
    codes: dict[str, int] = field(default_factory=dict)  # stream errors by status code
    loop_lag_ms: int = 0  # the event loop's longest delay since the last stats


@dataclass
class Run:
    """Run is a pod attempt the simulated agent says is running (or was killed)."""

    uid: str
    attempt: int
    state: str
    ports: dict[str, int]
    start_time: float
    finish_time: float = 0.0
    reason: str = ""

    def report(self) -> agent_pb2.PodReport:
        return agent_pb2.PodReport(
            pod_uid=self.uid,
            attempt=self.attempt,
            state=self.state,
            pid=1,
            ports=self.ports,
            start_time=self.start_time,
            finish_time=self.finish_time,
            reason=self.reason,
        )


class SimAgent:
    """SimAgent is one simulated node. `registered_at` is when its first Registered arrived;
    `last_sent_at` when it last sent anything the server counts as hearing from it (a
    register, a heartbeat, pod reports), so the server's node timeout runs from no earlier.
    Both are time.monotonic(), which every process of the machine shares."""

    def __init__(
        self,
        name: str,
        server: str,
        shape: NodeShape,
        counters: Counters,
        rng: random.Random,
        resync_s: float,
        on_registered: Callable[[SimAgent], None],
        usage_s: float = 0.0,
    ) -> None:
        self.name = name
        self.server = server
        self.shape = shape
        self.counters = counters
        self.resync_s = resync_s
        self.usage_s = usage_s  # 0: no usage reports
        self.on_registered = on_registered
        self.rng = rng
        self.period_s = 0.0  # the heartbeat period the server last named
        self.registered_at: float | None = None
        self.last_sent_at = 0.0
        self.silent = False
        self.runs: dict[str, Run] = {}
        self.errors: list[str] = []
        self.task: asyncio.Task[None] | None = None
        self._next_port = FIRST_PORT

    def start(self) -> None:
        self.task = asyncio.create_task(self.run(), name=self.name)

    def register(self) -> agent_pb2.AgentMessage:
        shape = self.shape
        reg = agent_pb2.Register(
            node_name=self.name,
            address="127.0.0.1",
            agent_version="swarm",
            runtimes=["simulated"],
            labels={"arranger.io/swarm": "true"},
        )
        reg.capacity.cpu, reg.capacity.memory = shape.cores, shape.memory_gib * GI
        reg.capacity.gpu = shape.gpus
        for i in range(shape.gpus):
            reg.gpus.add(
                index=i,
                uuid=f"GPU-{self.name}-{i}",
                model=shape.gpu_model,
                memory=shape.gpu_memory_gib * GI,
                fake=True,
            )
        reg.pods.extend(run.report() for run in self.runs.values())
        return agent_pb2.AgentMessage(register=reg)

    async def run(self) -> None:
        """run keeps a session open, reconnecting with the real agent's back-off."""
        backoff = RECONNECT_FIRST_S
        while True:
            started = time.monotonic()
            try:
                await self._session()
            except grpc.aio.AioRpcError as exc:
                self.counters.stream_errors += 1
                codes = self.counters.codes
                codes[exc.code().name] = codes.get(exc.code().name, 0) + 1
                if len(self.errors) < 3:
                    self.errors.append(f"{exc.code().name}: {exc.details()}")
            if self.silent:
                return  # a silenced agent stays away (the server would see it registered again)
            self.counters.reconnects += 1
            if time.monotonic() - started > RECONNECT_RESET_S:
                backoff = RECONNECT_FIRST_S
            await asyncio.sleep(reconnect_delay(backoff, self.rng))
            backoff = min(backoff * 2, RECONNECT_MAX_S)

    async def _session(self) -> None:
        async with grpc.aio.insecure_channel(self.server, options=CHANNEL_OPTIONS) as channel:
            call = agent_pb2_grpc.AgentServiceStub(channel).Connect()
            out: asyncio.Queue[agent_pb2.AgentMessage] = asyncio.Queue()
            self._send(out, self.register())
            tasks = [asyncio.create_task(_write(call, out))]
            try:
                async for msg in call:
                    kind = msg.WhichOneof("body")
                    if kind == "heartbeat_ack":
                        self.counters.acks += 1
                        self._timing(msg.heartbeat_ack.heartbeat_interval_s)
                    elif kind == "registered":
                        self.counters.registrations += 1
                        if self.registered_at is None:
                            self.registered_at = time.monotonic()
                            self.on_registered(self)
                        self._timing(msg.registered.heartbeat_interval_s or DEFAULT_PERIOD_S)
                        # Accepted at once, as the real agent does: then the node is Ready.
                        self._send(out, agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat()))
                        tasks += [
                            asyncio.create_task(
                                self._every(lambda: self.period_s, out, self._heartbeat)
                            ),
                            asyncio.create_task(
                                self._every(
                                    lambda: resync_period_s(self.resync_s, self.period_s),
                                    out,
                                    self._resync,
                                )
                            ),
                        ]
                        if self.usage_s > 0:
                            tasks.append(
                                asyncio.create_task(
                                    self._every(
                                        lambda: max(self.usage_s, self.period_s), out, self._usage
                                    )
                                )
                            )
                    elif kind == "commands":
                        self._commands(msg.commands, out)
                    elif kind == "log_request":
                        self.counters.log_requests += 1
                        reply = agent_pb2.LogData(
                            request_id=msg.log_request.request_id,
                            error="a simulated agent keeps no logs",
                        )
                        self._send(out, agent_pb2.AgentMessage(log_data=reply))
            finally:
                call.cancel()
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    def _timing(self, period_s: float) -> None:
        """_timing takes the period the server names (0: an older server's ack, keep it)."""
        if period_s > 0:
            self.period_s = period_s

    def _send(
        self, out: asyncio.Queue[agent_pb2.AgentMessage], message: agent_pb2.AgentMessage
    ) -> None:
        """_send queues a message for the server, unless the agent is silenced."""
        if not self.silent:
            out.put_nowait(message)
            self.last_sent_at = time.monotonic()

    async def _every(
        self,
        period_s: Callable[[], float],
        out: asyncio.Queue[agent_pb2.AgentMessage],
        message: Callable[[], agent_pb2.AgentMessage | None],
    ) -> None:
        """_every sends `message()` one period after the last (`period_s()` as it is when it
        sleeps, so a period the server stretches counts from the next one), until silent: as
        the real agent, agents that register at once send at once, spread only by the stagger
        of the server's periods and by when each registered."""
        while True:
            await asyncio.sleep(period_s())
            if self.silent:
                return
            sent = message()
            if sent is not None:
                self._send(out, sent)

    def _heartbeat(self) -> agent_pb2.AgentMessage:
        self.counters.heartbeats += 1
        usage = node_pb2.NodeUsage(cpu_percent=12.5, memory_used=64 * GI)
        return agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(usage=usage))

    def _usage(self) -> agent_pb2.AgentMessage | None:
        """_usage: a sample of every running attempt, as the real agent sends every
        usageIntervalSeconds or heartbeat period, the longer (made-up figures: 1.5 cores, 2 GiB, one GPU at 70 %)."""
        running = [run for run in self.runs.values() if run.state == "Running"]
        if not running:
            return None
        self.counters.usage_reports += 1
        report = agent_pb2.UsageReport()
        for run in running:
            pod = report.pods.add(pod_uid=run.uid, attempt=run.attempt)
            pod.usage.cpu_cores, pod.usage.memory_bytes = 1.5, 2 * GI
            pod.usage.memory_peak_bytes = 3 * GI
            pod.usage.gpus.add(index=0, utilization=70.0, memory_bytes=10 * GI)
        return agent_pb2.AgentMessage(usage=report)

    def _resync(self) -> agent_pb2.AgentMessage:
        self.counters.resyncs += 1
        reports = [run.report() for run in self.runs.values()]
        return agent_pb2.AgentMessage(pod_reports=agent_pb2.PodReports(reports=reports, full=True))

    def _commands(
        self, commands: agent_pb2.Commands, out: asyncio.Queue[agent_pb2.AgentMessage]
    ) -> None:
        """_commands: every launch runs at once, every kill ends at once; all their reports go
        in one message, as the real agent batches the changes of one loop turn."""
        now = time.time()
        changed: list[Run] = []
        for launch in commands.launch:
            self.counters.launches += 1
            ports = {}
            for name, wanted in launch.ports.items():
                if wanted <= 0:
                    self._next_port += 1
                ports[name] = wanted if wanted > 0 else self._next_port
            run = Run(launch.pod_uid, launch.attempt, "Running", ports, start_time=now)
            self.runs[run.uid] = run
            changed.append(run)
        for kill in commands.kill:
            self.counters.kills += 1
            found = self.runs.get(kill.pod_uid)
            if found is None or found.attempt != kill.attempt or found.state != "Running":
                continue
            found.state, found.finish_time, found.reason = "Killed", now, kill.reason
            changed.append(found)
        for uid in commands.forget_pods:
            self.runs.pop(uid, None)
        if changed:
            reports = agent_pb2.PodReports(reports=[run.report() for run in changed])
            self._send(out, agent_pb2.AgentMessage(pod_reports=reports))

    def silence(self, mode: str) -> None:
        """silence: "connected" stops its heartbeats and resyncs and keeps its stream open;
        "closed" ends its stream (closing its connection) for good."""
        self.silent = True
        if mode == "closed" and self.task is not None:
            self.task.cancel()


async def _write(call: Any, out: asyncio.Queue[agent_pb2.AgentMessage]) -> None:
    """_write sends what is queued, in order, one write at a time, until the stream ends (the
    reading side then says how)."""
    with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
        while True:
            await call.write(await out.get())


async def _loop_lag(counters: Counters) -> None:
    """_loop_lag keeps the longest this process's event loop was late, in ms: a swarm that
    cannot keep up delays its agents' messages, and the server would be blamed."""
    loop = asyncio.get_running_loop()
    while True:
        at = loop.time() + LAG_TICK_S
        await asyncio.sleep(LAG_TICK_S)
        counters.loop_lag_ms = max(counters.loop_lag_ms, round((loop.time() - at) * 1000))


def emit(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def serve(args: argparse.Namespace) -> None:
    """serve builds the agents, says ready, and obeys commands until told to stop."""
    counters = Counters()
    rng = random.Random(args.seed)
    shape = NodeShape(args.cores, args.memory_gib, args.gpus)
    waiting: set[str] = set()
    all_registered = asyncio.Event()

    def registered(agent: SimAgent) -> None:
        waiting.discard(agent.name)
        if not waiting:
            all_registered.set()

    agents = {
        name: SimAgent(
            name, args.server, shape, counters, rng, args.resync_s, registered, args.usage_s
        )
        for name in (f"{args.prefix}{i:05d}" for i in range(args.first, args.first + args.count))
    }
    waiting.update(agents)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    emit("ready", agents=len(agents))
    reporter: asyncio.Task[None] | None = None
    lag = asyncio.create_task(_loop_lag(counters))

    async def report_registered() -> None:
        started = time.monotonic()
        await all_registered.wait()
        times = [a.registered_at for a in agents.values() if a.registered_at is not None]
        emit("registered", agents=len(times), started=started, first=min(times), last=max(times))

    try:
        while line := await reader.readline():
            command = json.loads(line)
            cmd = command["cmd"]
            if cmd == "connect":
                for agent in agents.values():
                    agent.start()
                reporter = asyncio.create_task(report_registered())
            elif cmd == "silence":
                agent = agents[command["node"]]
                agent.silence(command["mode"])
                emit(
                    "silenced",
                    node=agent.name,
                    mode=command["mode"],
                    at=time.monotonic(),
                    last_sent=agent.last_sent_at,
                )
            elif cmd == "stats":
                errors = [e for a in agents.values() for e in a.errors][:5]
                emit(
                    "stats", **asdict(counters), errors=errors, loop_lags_ms=[counters.loop_lag_ms]
                )
                counters.loop_lag_ms = 0
            elif cmd == "stop":
                break
    finally:
        tasks = [lag, *(a.task for a in agents.values() if a.task is not None)]
        if reporter is not None:
            tasks.append(reporter)
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True, help="the server's address, host:port")
    parser.add_argument("--first", type=int, default=0, help="index of the first node")
    parser.add_argument("--count", type=int, required=True, help="how many agents")
    parser.add_argument("--prefix", default="swarm-", help="node names are PREFIX00042")
    parser.add_argument("--cores", type=int, default=NodeShape.cores)
    parser.add_argument("--memory-gib", type=int, default=NodeShape.memory_gib)
    parser.add_argument("--gpus", type=int, default=NodeShape.gpus)
    parser.add_argument("--resync-s", type=float, default=30.0, help="the agent's default")
    parser.add_argument("--usage-s", type=float, default=5.0, help="usage reports (0: none)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the reconnects' jitter")
    Collector().install()  # 5,000 agents' objects: collections would stall every agent at once
    asyncio.run(serve(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
