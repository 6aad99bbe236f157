"""A small cluster that runs the real core cycle after cycle, for properties over time.

Each cycle: build a snapshot, run the core, then apply the plan the way the server would:
placed pods start running; evicted pods stop (holding their resources for 1 to
`stop_cycles` cycles first, each pod drawn at random from a seeded generator) and go back to
pending — all of a job's pods when its minimum is evicted; a
job whose minimum has run for its `duration` cycles finishes and frees everything.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from arranger.sched import (
    JobInfo,
    NodeInfo,
    Plan,
    PodRequest,
    QueueInfo,
    SchedulerConfig,
    Snapshot,
    run_cycle,
)
from arranger.sched.plan import Claim, Reservation
from arranger.sched.resources import Res
from arranger.sched.snapshot import RunningPod


@dataclass
class SimJob:
    info: JobInfo  # pending holds every pod of the job; running is filled in by the simulator
    duration: int
    running: dict[str, tuple[str, int]] = field(default_factory=dict)  # pod -> (node, since)
    stopping: dict[str, tuple[str, int]] = field(default_factory=dict)  # pod -> (node, until)
    started: int | None = None
    finished: int | None = None
    evictions: int = 0


class Sim:
    def __init__(
        self,
        nodes: list[NodeInfo],
        queues: list[QueueInfo] | None = None,
        config: SchedulerConfig | None = None,
        stop_cycles: int = 1,
        seed: int = 0,
    ) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.queues = queues or []
        self.config = config or SchedulerConfig()
        self.stop_cycles = stop_cycles
        self.rng = random.Random(seed)
        self.jobs: dict[str, SimJob] = {}
        self.cycle = 0
        self.reservation: Reservation | None = None
        self.claims: tuple[Claim, ...] = ()
        self.plans: list[Plan] = []

    def submit(self, info: JobInfo, duration: int) -> None:
        self.jobs[info.id] = SimJob(info, duration)

    def pods(self, job: SimJob) -> dict[str, PodRequest]:
        return {p.name: p for p in job.info.pending}

    def snapshot(self) -> Snapshot:
        used: dict[str, list[int]] = {n: [0, 0] for n in self.nodes}
        jobs = []
        for job in self.jobs.values():
            pods = self.pods(job)
            if job.finished is not None:  # ended, but pods still stopping hold their node
                for name, (node, _) in job.stopping.items():
                    used[node][0] += pods[name].cpu_milli
                    used[node][1] += pods[name].memory_bytes
                continue
            running, held = [], Res()
            for name, (node, since) in [*job.running.items(), *job.stopping.items()]:
                pod = pods[name]
                used[node][0] += pod.cpu_milli
                used[node][1] += pod.memory_bytes
                held = held + pod.request
                running.append(
                    RunningPod(
                        name,
                        node,
                        pod.request,
                        (),
                        pod.role,
                        pod.in_minimum,
                        float(since),
                        name in job.stopping,
                    )
                )
            pending = tuple(
                p for n, p in pods.items() if n not in job.running and n not in job.stopping
            )
            info = JobInfo(
                id=job.info.id,
                name=job.info.name,
                queue=job.info.queue,
                priority=job.info.priority,
                submit_time=job.info.submit_time,
                pending=pending,
                running=tuple(running),
                basic_policy=job.info.basic_policy,
                allocated=held,
                waiting_since=job.info.waiting_since if job.started is None else float(self.cycle),
                preemptible=job.info.preemptible,
                start_time=None if job.started is None else float(job.started),
            )
            jobs.append(info)
        nodes = tuple(
            NodeInfo(
                n.name,
                n.cpu_milli,
                n.memory_bytes,
                n.gpus,
                used[n.name][0],
                used[n.name][1],
                n.labels,
            )
            for n in self.nodes.values()
        )
        return Snapshot(
            float(self.cycle),
            nodes,
            tuple(jobs),
            tuple(self.queues),
            self.reservation,
            claims=self.claims,
        )

    def step(self) -> Plan:
        snap = self.snapshot()
        plan = run_cycle(snap, self.config)
        self.plans.append(plan)
        self.reservation = plan.reservation
        self.claims = tuple(plan.claims)
        for job in self.jobs.values():  # stopped pods are gone now
            for name, (_, until) in list(job.stopping.items()):
                if until <= self.cycle:
                    del job.stopping[name]
        for placement in plan.placements:
            job = self.jobs[placement.job_id]
            job.running[placement.pod] = (placement.node, self.cycle)
            if job.started is None and all(
                p.name in job.running for p in job.info.pending if p.in_minimum
            ):
                job.started = self.cycle
        by_job: dict[str, list[str]] = {}
        for eviction in plan.evictions:
            by_job.setdefault(eviction.job_id, []).append(eviction.pod)
        for job_id, taken in by_job.items():
            job = self.jobs[job_id]
            pods = self.pods(job)
            job.evictions += 1
            names = taken
            if any(pods[n].in_minimum for n in taken):
                names, job.started = list(job.running), None  # the whole job goes
            for name in names:
                node, _ = job.running.pop(name)
                job.stopping[name] = (node, self.cycle + self.rng.randint(1, self.stop_cycles))
        for job in self.jobs.values():
            if (
                job.started is not None
                and job.finished is None
                and self.cycle - job.started >= job.duration
            ):
                job.finished = self.cycle
                job.running.clear()
        self.cycle += 1
        return plan

    def run(self, cycles: int) -> None:
        for _ in range(cycles):
            self.step()


def taken_back(
    taken: list[tuple[int, str, str]], changes: set[int], window: int = 6
) -> list[tuple[int, str, str, list[int]]]:
    """taken_back: the cross-queue takings (cycle, taker's queue, victim's queue) undone
    within `window` cycles by an opposite one with no change of demand in between (a job
    arriving or finishing, at the cycles in `changes`), each with the cycles that undid it."""
    found = []
    for cycle, taker, victim in taken:
        undone = [
            c
            for c, t, v in taken
            if t == victim
            and v == taker
            and cycle < c <= cycle + window
            and not any(cycle < change <= c for change in changes)
        ]
        if undone:
            found.append((cycle, taker, victim, undone))
    return found
