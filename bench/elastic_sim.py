"""elastic_sim: the simulation bench/elastic.py runs (its docstring states the model).

Sim replays one workload under one variant through the real Controller, the server's
SchedulingState and Timers and the real scheduling core, on simulated time: simulated agents
answer launch and kill orders, simulated learners do their work, checkpoint, confirm
checkpoints under a whole-job notice and (elastic variants) scale their actors.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field
from typing import Any

from arranger.client.specfile import load_job_data
from arranger.sched import SchedulerConfig, run_cycle
from arranger.server.controller import Controller
from arranger.server.controller_config import ControllerConfig
from arranger.server.convert import spec_to_json
from arranger.server.effects import Effects
from arranger.server.model import GpuRecord, JobRecord
from arranger.server.nodes import NodeRegistration, PodReport
from arranger.server.scaling import scale_problem
from arranger.server.snapshot import SchedulingState
from arranger.server.timers import Timers
from arranger.server.validation import parse_job
from arranger.spec import JobSpec
from arranger.states import PodState, Role, Stage

GI = 2**30
ALPHA = 0.8  # work per second = running actors ** ALPHA
LAUNCH_S = 2.0  # launch order -> RUNNING report
EXIT_S = 1.0  # kill order -> KILLED report (at most the order's grace)
GRACE_S = 5.0  # every job's preemptionGraceSeconds
CYCLE_S = 1.0  # the least time between two scheduling cycles (the server's schedulePeriod)
POLL_S = 10.0  # an elastic learner looks at its actors and the cluster this often
PATIENCE_S = 60.0  # actors wanted but not running this long are given back
CHECKPOINT_S = 600.0  # a running learner saves its progress this often
SAVE_S = 10.0  # a learner under a whole-job notice confirms a checkpoint this much later
NOTICE_S = 30.0  # evictionNoticeSeconds in the elastic-notice variant
ACTORS = "actors"
NODE_CPU, NODE_GPUS, NODE_MEMORY = 64_000, 8, 512 * GI
LEADER = {"cpu": "4", "memory": "16Gi", "gpu": "1"}
CPU_ACTOR = {"cpu": "1", "memory": "2Gi"}
GPU_ACTOR = {"cpu": "1", "memory": "4Gi", "gpu": "0.25"}
# The shapes: offered load (the workload's dominant demand at full size over the cluster's,
# over the arrival span) and how arrivals are spread.
SHAPES = {"steady": 1.0, "heavy": 1.6, "light": 0.5, "burst": 0.0}  # burst: all in 10 minutes


@dataclass(frozen=True)
class Variant:
    """Variant: how the elastic-kind jobs are declared (see the module docstring)."""

    name: str
    size: str  # counts at submit: "max", "mid" or "start"
    minimum: str  # minWorkersNum: "counts" or "start"
    scaling: bool = False
    notice_s: float = 0.0


VARIANTS = (
    Variant("fixed-max", "max", "counts"),
    Variant("fixed-mid", "mid", "counts"),
    Variant("surplus", "max", "start"),
    Variant("elastic", "start", "start", scaling=True),
    Variant("elastic-notice", "start", "start", scaling=True, notice_s=NOTICE_S),
)


@dataclass(frozen=True)
class JobPlan:
    """JobPlan: one job of the workload. Rigid jobs have start == most."""

    name: str
    arrival_s: float
    priority: int
    elastic: bool
    gpu_actors: bool
    start: int
    most: int
    work: float

    def sizes(self, variant: Variant) -> tuple[int, int, int]:
        """sizes: (counts, maxCounts, minWorkersNum) under the variant."""
        if not self.elastic:
            return self.most, self.most, self.most
        counts = {"max": self.most, "mid": (self.start + self.most) // 2, "start": self.start}
        n = counts[variant.size]
        return n, self.most, n if variant.minimum == "counts" else self.start

    def spec(self, variant: Variant) -> JobSpec:
        counts, most, minimum = self.sizes(variant)
        actor = GPU_ACTOR if self.gpu_actors else CPU_ACTOR
        doc: dict[str, Any] = {
            "apiVersion": "arranger/v1",
            "kind": "TYJob",
            "metadata": {"name": self.name},
            "spec": {
                "priority": self.priority,
                "minWorkersNum": minimum,
                "preemptionGraceSeconds": GRACE_S,
                "evictionNoticeSeconds": variant.notice_s,
                "leader": {
                    "name": "learner",
                    "template": {"command": ["learner"], "resources": LEADER},
                },
                "workerSets": [
                    {
                        "name": ACTORS,
                        "counts": counts,
                        "maxCounts": most,
                        "template": {"command": ["actor"], "resources": actor},
                    }
                ],
            },
        }
        return parse_job(load_job_data(doc))


def workload(jobs: int, seed: int, nodes: int, shape: str) -> list[JobPlan]:
    """workload: the jobs, drawn with random.Random(seed), arrivals spread for the shape."""
    rng = random.Random(seed)
    drawn: list[tuple[int, bool, bool, int, int, float]] = []
    for _ in range(jobs):
        priority = rng.choices((2, 5, 8), (4, 4, 2))[0]
        elastic, gpu_actors = rng.random() < 0.5, rng.random() < 0.3
        if elastic:
            start, most = (2, rng.choice((8, 16))) if gpu_actors else (4, rng.choice((16, 32, 48)))
        else:
            start = most = rng.choice((4, 8)) if gpu_actors else rng.choice((8, 16, 24))
        duration = math.exp(rng.uniform(math.log(1200), math.log(5400)))
        drawn.append((priority, elastic, gpu_actors, start, most, duration))
    # The dominant share of each job's full-size demand, in cluster-seconds.
    demand = 0.0
    for _, _, gpu_actors, _, most, duration in drawn:
        cpu = (4 + most) * 1000 / (nodes * NODE_CPU)
        gpu = (1 + (most / 4 if gpu_actors else 0)) / (nodes * NODE_GPUS)
        demand += max(cpu, gpu) * duration
    load = SHAPES[shape]
    span = demand / load if load else 600.0
    times = sorted(rng.uniform(0, span) for _ in range(jobs))
    return [
        JobPlan(f"j{i:04d}", round(t, 1), p, e, g, s, m, round(d * m**ALPHA, 1))
        for i, (t, (p, e, g, s, m, d)) in enumerate(zip(times, drawn, strict=True))
    ]


@dataclass
class Run:
    """Run: the simulated learner of one job. `done` is work done up to `since`, at `rate`;
    `saved` its last checkpoint; `version` invalidates completion events made earlier."""

    plan: JobPlan
    job: JobRecord
    done: float = 0.0
    saved: float = 0.0
    rate: float = 0.0
    since: float = 0.0
    version: int = 0
    leader_attempt: int = -1  # the attempt whose checkpoints are due
    short_since: float | None = None  # when wanted actors were first seen not running
    confirming: bool = False
    lost: float = 0.0


@dataclass
class Stats:
    """Stats: what one replay counted; `samples` are (time, GPU milli, CPU milli) held from
    that time on, a new one only when either changed."""

    cycles: int = 0
    scale_ups: int = 0
    scale_downs: int = 0
    evicted_pods: int = 0
    whole_evictions: int = 0
    notices: int = 0
    confirms: int = 0
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # t, gpu, cpu milli


ARRIVE, RUNNING, EXITED, DONE, CHECKPOINT, POLL, CONFIRM = range(7)


class Sim:
    """Sim replays one workload under one variant (see the module docstring)."""

    def __init__(self, plans: list[JobPlan], variant: Variant, nodes: int) -> None:
        self.variant = variant
        self.c = Controller(ControllerConfig(max_eviction_notice_s=300.0))
        self.config = SchedulerConfig()
        self.state = SchedulingState(self.c, [self.config.machine_group_label])
        self.timers = Timers(self.c.timer, CYCLE_S)
        self.now = 0.0
        self.heap: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        self.live: dict[tuple[str, int], bool] = {}  # (pod uid, attempt) -> running yet
        self.dying: set[tuple[str, int]] = set()
        self.runs: dict[str, Run] = {}
        self.touched: set[str] = set()
        self.changed, self.last_cycle, self.wake = False, -math.inf, math.inf
        self.stats = Stats()
        self.room_cache: dict[tuple[int, int, int], int] | None = None
        self.held: dict[str, tuple[int, int]] = {}  # pod uid -> GPU and CPU milli it holds
        self.held_total = (0, 0)
        self.capacity = (nodes * NODE_GPUS * 1000, nodes * NODE_CPU)
        for i in range(nodes):
            gpus = tuple(GpuRecord(g, f"GPU-{i}-{g}", "A100", 80 * GI) for g in range(NODE_GPUS))
            reg = NodeRegistration(
                f"node-{i:02d}", f"10.0.{i // 250}.{i % 250 + 1}", NODE_CPU, NODE_MEMORY, gpus=gpus
            )
            self.handle(self.c.node_registered(reg, 0.0))
        self.expected = len(plans)
        for plan in plans:
            self.push(plan.arrival_s, ARRIVE, plan)

    def push(self, at: float, kind: int, arg: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, self.seq, kind, arg))

    # The shell: effects carried out as simulated agents would.

    def handle(self, fx: Effects) -> None:
        self.state.changed(fx)
        for uid in fx.pods:
            self.hold(uid)
        touched = fx.touched_jobs()
        self.timers.changed(touched)
        self.touched |= touched
        self.room_cache = None
        self.changed = self.changed or fx.schedule
        for order in fx.launches:
            self.live[(order.pod_uid, order.attempt)] = False
            self.push(self.now + LAUNCH_S, RUNNING, order)
        for kill in fx.kills:
            key = (kill.pod_uid, kill.attempt)
            if key in self.live and key not in self.dying:
                self.dying.add(key)
                self.push(self.now + min(kill.grace_s, EXIT_S), EXITED, (kill.node, key))
        for event in fx.events:
            if event.kind == "EvictionNotice":
                self.stats.notices += 1
            elif event.kind == Stage.PENDING.value and event.message.startswith("Preempted"):
                self.stats.whole_evictions += 1

    def hold(self, uid: str) -> None:
        """hold keeps what the pod holds (GPU and CPU milli) in `held` and `held_total`."""
        found = self.c.pod_by_uid(uid)
        now = (0, 0)
        if found is not None and found[1].state.holds_resources:
            res = found[0].spec.template_of(found[1].worker_set).resources
            now = (res.gpu_milli, res.cpu_milli)
        before = self.held.pop(uid, (0, 0))
        if now != (0, 0):
            self.held[uid] = now
        gpu, cpu = self.held_total
        self.held_total = (gpu + now[0] - before[0], cpu + now[1] - before[1])

    def report(self, node: str, report: PodReport) -> None:
        self.handle(self.c.pod_reports(node, [report], self.now))

    # Events.

    def step(self, kind: int, arg: Any) -> None:
        if kind == ARRIVE:
            plan: JobPlan = arg
            spec = plan.spec(self.variant)
            job, fx = self.c.submit(plan.name, spec, spec_to_json(spec), self.now)
            self.runs[job.id] = Run(plan, job, since=self.now)
            self.handle(fx)
            if self.variant.scaling and plan.elastic:
                self.push(self.now + POLL_S, POLL, job.id)
        elif kind == RUNNING:
            key = (arg.pod_uid, arg.attempt)
            if self.live.get(key) is False:
                self.live[key] = True
                ports = {name: 20000 + i for i, name in enumerate(arg.ports)}
                self.report(
                    arg.node,
                    PodReport(arg.pod_uid, arg.attempt, PodState.RUNNING, pid=1, ports=ports),
                )
        elif kind == EXITED:
            node, key = arg
            self.dying.discard(key)
            if self.live.pop(key, None) is None:
                return
            found = self.c.pod_by_uid(key[0])
            if found is not None and found[1].role == Role.LEADER and found[1].attempt == key[1]:
                self.lose(self.runs[found[0].id])
            self.report(node, PodReport(key[0], key[1], PodState.KILLED, exit_code=143))
        elif kind == DONE:
            run = self.runs[arg[0]]
            if arg[1] == run.version:
                self.finish(run)
        elif kind == CHECKPOINT:
            run = self.runs[arg[0]]
            if arg[1] == run.leader_attempt and not run.job.stage.finished:
                self.advance(run)
                run.saved = run.done
                self.push(self.now + CHECKPOINT_S, CHECKPOINT, arg)
        elif kind == POLL:
            run = self.runs[arg]
            if not run.job.stage.finished:
                self.poll(run)
                self.push(self.now + POLL_S, POLL, arg)
        elif kind == CONFIRM:
            run = self.runs[arg]
            run.confirming = False
            if run.job.leader.evict_at is not None and run.job.active:
                self.advance(run)
                run.saved = run.done
                fx = self.c.confirm_checkpoint(run.job, self.now)
                if fx is not None:
                    self.stats.confirms += 1
                    self.handle(fx)

    def finish(self, run: Run) -> None:
        """finish: the learner's work is done; it exits 0."""
        leader = run.job.leader
        key = (leader.uid, leader.attempt)
        if self.live.pop(key, None) is None:
            return
        self.dying.discard(key)
        done = PodReport(leader.uid, leader.attempt, PodState.SUCCEEDED, exit_code=0)
        self.report(leader.node, done)

    def lose(self, run: Run) -> None:
        """lose: the learner stopped; the work since its last checkpoint is lost."""
        self.advance(run)
        run.lost += run.done - run.saved
        run.done = run.saved
        run.leader_attempt = -1

    # Progress.

    def advance(self, run: Run) -> None:
        run.done += run.rate * (self.now - run.since)
        run.since = self.now

    def rerate(self, run: Run) -> None:
        """rerate: the job's rate from what runs now; its completion is due again."""
        self.advance(run)
        job, leader = run.job, run.job.leader
        up = leader.state == PodState.RUNNING and (leader.uid, leader.attempt) in self.live
        if up and run.leader_attempt != leader.attempt:
            run.leader_attempt = leader.attempt
            self.push(self.now + CHECKPOINT_S, CHECKPOINT, (job.id, leader.attempt))
        n = sum(1 for p in job.workers() if p.state == PodState.RUNNING) if up else 0
        rate = n**ALPHA if n and not job.stage.finished else 0.0
        if rate != run.rate:
            run.rate, run.version = rate, run.version + 1
            if rate > 0:
                left = max(run.plan.work - run.done, 0.0)
                self.push(self.now + left / rate, DONE, (job.id, run.version))
        noticed = leader.evict_at is not None and self.now + SAVE_S < leader.evict_at
        if noticed and up and not run.confirming and job.active:
            run.confirming = True
            self.push(self.now + SAVE_S, CONFIRM, job.id)

    # The learner's scaling policy.

    def poll(self, run: Run) -> None:
        job = run.job
        if job.stage != Stage.RUNNING or job.leader.evict_at is not None:
            run.short_since = None
            return
        ws = job.spec.worker_set(ACTORS)
        assert ws is not None
        actors = job.workers()
        up = [p for p in actors if p.state == PodState.RUNNING and not p.stopping]
        if len(up) == ws.counts and all(p.evict_at is None for p in up):
            run.short_since = None
            if ws.counts < ws.most:
                more = min(ws.most - ws.counts, ws.counts, self.room(job))
                if more > 0:
                    self.scale(run, ws.counts + more)
            return
        if run.short_since is None:
            run.short_since = self.now
        elif self.now - run.short_since >= PATIENCE_S:
            holding = [p.index for p in actors if p.state.holds_resources]
            target = max(max(holding, default=-1) + 1, run.plan.start)
            if target < ws.counts:
                self.scale(run, target)
            run.short_since = None

    def scale(self, run: Run, counts: int) -> None:
        if scale_problem(run.job, ACTORS, counts) is not None:
            return
        up = counts > run.job.spec.num_workers
        self.handle(self.c.scale(run.job, ACTORS, counts, self.now, "learner"))
        if up:
            self.stats.scale_ups += 1
        else:
            self.stats.scale_downs += 1

    def room(self, job: JobRecord) -> int:
        """room: how many more of the job's actors the learner sees room for: per node on the
        schedulable nodes not reserved, and in all less what waiting pods ask for."""
        res = job.spec.template_of(ACTORS).resources
        want = (res.cpu_milli, res.memory_bytes, res.gpu_milli)
        if self.room_cache is None:
            self.room_cache = {}
        if want in self.room_cache:
            return self.room_cache[want]
        self.state.refresh()
        reserved = set(self.c.reservation.nodes) if self.c.reservation else set()
        cpu_m, mem_b, gpu_m = want
        per_node = 0
        free = [0, 0, 0]
        for node in self.state.infos.values():
            if not node.schedulable or not node.ready or node.name in reserved:
                continue
            cpu = node.cpu_milli - node.used_cpu_milli
            mem = node.memory_bytes - node.used_memory_bytes
            gpus = [1000 - g.used_milli for g in node.gpus]
            free = [free[0] + cpu, free[1] + mem, free[2] + sum(gpus)]
            fits = min(cpu // cpu_m, mem // mem_b)
            if gpu_m:
                fits = min(fits, sum(g // gpu_m for g in gpus))
            per_node += max(fits, 0)
        for info in self.state.pending.values():
            for pod in info.pending:
                free = [
                    free[0] - pod.cpu_milli,
                    free[1] - pod.memory_bytes,
                    free[2] - pod.gpu_milli,
                ]
        overall = min(f // w for f, w in zip(free, want, strict=True) if w)
        self.room_cache[want] = answer = max(0, min(per_node, overall))
        return answer

    # The loop.

    def next_time(self) -> float | None:
        times = [self.heap[0][0]] if self.heap else []
        if (timer := self.timers.next(self.now)) is not None:
            times.append(timer)
        if self.changed:
            times.append(max(self.now, self.last_cycle + CYCLE_S))
        if self.wake < math.inf:
            times.append(max(self.now, self.wake))
        return min(times, default=None)

    def cycle(self) -> None:
        self.changed, self.last_cycle, self.wake = False, self.now, math.inf
        snapshot = self.state.snapshot(self.now)
        for node in snapshot.nodes:  # the core's word: never more than a node has
            if node.used_cpu_milli > node.cpu_milli or any(g.used_milli > 1000 for g in node.gpus):
                raise AssertionError(f"{node.name} overcommitted at {self.now:.1f} s: {node}")
        if not snapshot.jobs:
            return
        plan = run_cycle(snapshot, self.config)
        self.stats.cycles += 1
        self.stats.evicted_pods += len(plan.evictions)
        fx = self.c.apply_plan(plan, self.now)
        fx.schedule = False  # as the server: this cycle has seen everything released so far
        self.handle(fx)
        if plan.wake_at is not None:
            self.wake = max(plan.wake_at, self.now + CYCLE_S)

    def run(self, limit_s: float) -> None:
        while (at := self.next_time()) is not None and at <= limit_s:
            self.now = at
            while self.heap and self.heap[0][0] <= at:
                _, _, kind, arg = heapq.heappop(self.heap)
                self.step(kind, arg)
            due = [j for j in map(self.c.jobs.get, self.timers.due(at)) if j is not None]
            if due:
                self.handle(self.c.tick(at, due))
            if (self.changed and at >= self.last_cycle + CYCLE_S) or at >= self.wake:
                self.cycle()
            for job_id in self.touched:
                if (run := self.runs.get(job_id)) is not None:
                    self.rerate(run)
            self.touched.clear()
            self.sample()
            if self.settled():
                break

    def settled(self) -> bool:
        """settled: every job arrived and ended, and no process is left."""
        if len(self.runs) < self.expected or self.live:
            return False
        return all(r.job.stage.finished for r in self.runs.values())

    def sample(self) -> None:
        """sample records what pods hold now, if it changed."""
        samples, now = self.stats.samples, (self.now, *self.held_total)
        if not samples or samples[-1][1:] != now[1:]:
            samples.append(now)
