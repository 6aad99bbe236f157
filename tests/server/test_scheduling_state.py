"""SchedulingState, kept from the effects of each change, equals a snapshot built from scratch.

Generated sequences of stimuli (hypothesis) drive a real controller: agents join, leave and
fall silent, jobs are submitted, placed by the real scheduling core, run, fail, are evicted
(with or without notice), scaled, confirm checkpoints, are stopped and deleted, nodes are
cordoned and drained, and time passes. After every step the incrementally kept snapshot must
equal the one `build_snapshot` computes from every record, its kept node arrays and job index
those built from its nodes and jobs, and each cycle's plan the plan of the same snapshot
without them. Written to a real SQLite store as they happen, the changes rebuild, in a fresh
controller loaded from it, the same usage on every node.
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from arranger.client.specfile import load_job_yaml
from arranger.sched import GPU_MILLI, Snapshot, run_cycle
from arranger.sched.nodes import NodeArrays
from arranger.sched.plan import Eviction, Plan
from arranger.sched.snapshot import index_jobs
from arranger.server.controller import Controller, ControllerConfig
from arranger.server.convert import spec_from_json, spec_to_json
from arranger.server.effects import Effects
from arranger.server.model import GpuRecord
from arranger.server.nodes import NodeRegistration, PodReport
from arranger.server.scaling import scale_problem
from arranger.server.snapshot import SchedulingState, build_snapshot
from arranger.server.store import Store, open_store, sqlite_url
from arranger.server.validation import parse_job
from arranger.server.writes import batch_for
from arranger.states import PodState, Role
from tests.sched.builders import same_arrays

NODES = ("n1", "n2", "n3", "n4")
SPEC = """
metadata: {{name: j{n}}}
spec:
  restartLimit: 1
  priority: {priority}
  minWorkersNum: {minimum}
  cleanPodPolicy: {policy}
  evictionNoticeSeconds: {notice}
  leader: {{name: l, template: {{command: [l], resources: {{cpu: "{cpu}", gpu: "{gpu}"}}}}}}
  workerSets: [{{name: w, counts: {workers}, maxCounts: 4, template: {{command: [w], resources: {{cpu: "1"}}}}}}]
"""

step = st.one_of(
    st.tuples(st.just("register"), st.sampled_from(NODES), st.sampled_from([4, 8])),
    st.tuples(st.just("disconnect"), st.sampled_from(NODES)),
    st.tuples(st.just("cordon"), st.sampled_from(NODES), st.booleans()),
    st.tuples(st.just("drain"), st.sampled_from(NODES)),
    st.tuples(
        st.just("submit"),
        st.integers(1, 3),
        st.sampled_from(["All", "None", "Running"]),
        st.sampled_from(["1", "2"]),
        st.sampled_from(["0", "0.5", "1"]),
        st.sampled_from([0, 10]),
    ),
    st.tuples(st.just("cycle")),
    st.tuples(st.just("cycle")),
    st.tuples(st.just("report"), st.integers(0, 50), st.sampled_from(list(PodState))),
    st.tuples(st.just("report"), st.integers(0, 50), st.just(PodState.RUNNING)),
    st.tuples(st.just("run")),
    st.tuples(st.just("evict"), st.integers(0, 50)),
    st.tuples(st.just("evict"), st.integers(0, 50)),
    st.tuples(st.just("scale"), st.integers(0, 9), st.integers(0, 4)),
    st.tuples(st.just("confirm"), st.integers(0, 9)),
    st.tuples(st.just("stop"), st.integers(0, 9)),
    st.tuples(st.just("delete"), st.integers(0, 9)),
    st.tuples(st.just("time"), st.sampled_from([0.5, 5.0, 40.0])),
)


# Every sequence starts on a small cluster with a job waiting.
START: list[tuple[object, ...]] = [
    ("register", "n1", 4),
    ("register", "n2", 8),
    ("submit", 2, "None", "1", "0.5", 10),
]


def canonical(snap: Snapshot) -> Snapshot:
    """canonical: the snapshot with its jobs and queues in one order (the core ignores it)."""
    return Snapshot(
        snap.now,
        snap.nodes,
        tuple(sorted(snap.jobs, key=lambda j: j.id)),
        tuple(sorted(snap.queues, key=lambda q: q.name)),
        snap.reservation,
    )


class World:
    """World: a controller, the state kept from its effects, and a clock."""

    def __init__(self) -> None:
        self.c = Controller(ControllerConfig(node_timeout_s=30.0, backoff_initial_s=1.0))
        self.state = SchedulingState(self.c, ["zone"])
        self.now = 1000.0
        self.submitted = 0
        self.effects = Effects()  # everything changed since the last `written`

    def written(self, store: Store) -> None:
        """written stores what changed since the last call, as the server's commit does."""
        asyncio.run(store.write(batch_for(self.c.view, self.effects, [])))
        self.effects = Effects()

    def apply(self, fx: Effects) -> None:
        self.state.changed(fx)
        self.effects.merge(fx)

    def pods(self) -> list[tuple[str, str]]:
        return sorted(
            (job.id, pod.name)
            for job in self.c.jobs.values()
            for pod in job.pods.values()
            if pod.state.holds_resources
        )

    def job(self, index: int) -> str | None:
        ids = sorted(self.c.jobs)
        return ids[index % len(ids)] if ids else None

    def do(self, action: tuple[object, ...]) -> None:
        c, now = self.c, self.now
        kind = action[0]
        if kind == "register":
            name, gpus = str(action[1]), int(action[2])  # type: ignore[call-overload]
            reg = NodeRegistration(
                name,
                "127.0.0.1",
                8000,
                2**34,
                gpus=tuple(GpuRecord(i, f"GPU-{name}-{i}", "A100", 2**34) for i in range(gpus)),
                labels={"zone": "a"} if gpus > 4 else {},
            )
            self.apply(c.node_registered(reg, now))
        elif kind == "disconnect":
            self.apply(c.node_disconnected(str(action[1]), now))
        elif kind in ("cordon", "drain") and action[1] in c.nodes:
            name = str(action[1])
            fx = c.cordon(name, bool(action[2]), now) if kind == "cordon" else c.drain(name, now)
            self.apply(fx)
        elif kind == "submit":
            n = self.submitted
            self.submitted += 1
            workers, policy, cpu, gpu, *more = action[1:]
            text = SPEC.format(
                n=n,
                workers=workers,
                minimum=min(1, int(workers)),  # type: ignore[call-overload]
                policy=policy,
                cpu=cpu,
                gpu=gpu,
                notice=more[0] if more else 0,
                priority=more[1] if len(more) > 1 else 5,
            )
            spec = parse_job(load_job_yaml(text))
            _, fx = c.submit(f"id{n:03d}", spec, spec_to_json(spec), now)
            self.apply(fx)
        elif kind == "cycle":
            snap = self.state.snapshot(now)
            if snap.jobs:
                plan = run_cycle(snap)
                assert plan == run_cycle(dataclasses.replace(snap, arrays=None, index=None))
                self.apply(c.apply_plan(plan, now))
        elif kind == "report":
            pods = self.pods()
            if pods:
                job_id, name = pods[int(action[1]) % len(pods)]  # type: ignore[call-overload]
                pod = c.jobs[job_id].pods[name]
                state = action[2]
                assert isinstance(state, PodState)
                exit_code = (0 if state == PodState.SUCCEEDED else 1) if state.terminal else None
                report = PodReport(pod.uid, pod.attempt, state, pid=7, exit_code=exit_code)
                self.apply(c.pod_reports(pod.node, [report], now))
        elif kind == "run":  # the agents report every pod launched as running
            for job in list(c.jobs.values()):
                for pod in job.pods.values():
                    if pod.state == PodState.LAUNCHING:
                        ports = {"rpc": 7000} if pod.role == Role.LEADER else {}
                        report = PodReport(
                            pod.uid, pod.attempt, PodState.RUNNING, pid=7, ports=ports
                        )
                        self.apply(c.pod_reports(pod.node, [report], now))
        elif kind == "evict":
            pods = self.pods()
            if pods:
                job_id, name = pods[int(action[1]) % len(pods)]  # type: ignore[call-overload]
                node = c.jobs[job_id].pods[name].node
                plan = Plan(evictions=[Eviction(job_id, name, node, "x", "preempted")])
                self.apply(c.apply_plan(plan, now))
        elif kind in ("scale", "confirm"):
            job_id = self.job(int(action[1]))  # type: ignore[call-overload]
            if job_id is not None:
                job = c.jobs[job_id]
                if kind == "confirm":
                    self.apply(c.confirm_checkpoint(job, now) or Effects())
                elif scale_problem(job, "w", int(action[2])) is None:  # type: ignore[call-overload]
                    self.apply(c.scale(job, "w", int(action[2]), now))  # type: ignore[call-overload]
        elif kind in ("stop", "delete"):
            job_id = self.job(int(action[1]))  # type: ignore[call-overload]
            if job_id is not None:
                job = c.jobs[job_id]
                if not job.deleted:
                    self.apply(c.stop(job, now) if kind == "stop" else c.delete(job, now))
        elif kind == "time":
            self.now += float(action[1])  # type: ignore[arg-type]
            self.apply(c.check_nodes(self.now))
            self.apply(c.tick(self.now))


@settings(max_examples=120, deadline=None)
@given(steps=st.lists(step, min_size=1, max_size=40))
def test_the_kept_snapshot_equals_one_built_from_every_record(
    steps: list[tuple[object, ...]],
) -> None:
    world = World()
    for action in START + steps:
        world.do(action)
        check(world, action)


# Elastic jobs with notice on a busy cluster: fewer kinds of stimuli, so that sequences reach
# notices given, ended, confirmed and overtaken by scales, crashes, drains and stops.
elastic_step = st.one_of(
    st.tuples(st.just("cycle")),
    st.tuples(st.just("run")),
    st.tuples(st.just("evict"), st.integers(0, 50)),
    st.tuples(st.just("evict"), st.integers(0, 50)),
    st.tuples(st.just("scale"), st.integers(0, 9), st.integers(0, 4)),
    st.tuples(st.just("confirm"), st.integers(0, 9)),
    st.tuples(st.just("report"), st.integers(0, 50), st.sampled_from(list(PodState))),
    st.tuples(st.just("drain"), st.sampled_from(NODES[:2])),
    st.tuples(st.just("cordon"), st.sampled_from(NODES[:2]), st.just(False)),
    st.tuples(st.just("stop"), st.integers(0, 9)),
    st.tuples(
        st.just("submit"),
        st.integers(1, 3),
        st.just("All"),
        st.just("5"),
        st.just("0"),
        st.just(0),
        st.just(9),
    ),  # a job that evicts to get room
    st.tuples(st.just("time"), st.sampled_from([5.0, 40.0])),
    st.tuples(st.just("time"), st.just(10.0)),
)
ELASTIC_START: list[tuple[object, ...]] = [
    ("register", "n1", 4),
    ("register", "n2", 8),
    ("submit", 2, "None", "1", "0.5", 10),
    ("submit", 3, "All", "1", "0", 10),
    ("submit", 3, "Running", "2", "0", 10),  # 12 of the 16 cores taken
    ("cycle",),
    ("run",),
    ("run",),
]


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(elastic_step, min_size=5, max_size=30))
def test_the_kept_snapshot_equals_one_built_from_every_record_through_scales_and_notices(
    steps: list[tuple[object, ...]],
) -> None:
    world = World()
    for action in ELASTIC_START + steps:
        world.do(action)
        check(world, action)
        for job in world.c.jobs.values():
            noticed = [p for p in job.pods.values() if p.evict_at is not None]
            assert job.active or not noticed, f"{job.id} ended with pods under notice"
            if job.leader.evict_at is None:  # notices for surplus workers only
                assert all(p.state.holds_resources and not p.in_minimum for p in noticed), action


@settings(max_examples=25, deadline=None)
@given(steps=st.lists(step, min_size=1, max_size=40), every=st.integers(1, 8))
def test_the_kept_usage_equals_a_rebuild_from_the_store(
    steps: list[tuple[object, ...]], every: int
) -> None:
    """The changes are written to a real SQLite store (every `every` steps, many at once, as
    the server groups commits); a fresh controller loaded from it, as a restarted server's is,
    gives every node the same capacity and usage (CPU, memory, each GPU), the same jobs to
    schedule and the same pods holding room as the kept state."""
    with tempfile.TemporaryDirectory() as tmp:
        store = asyncio.run(open_store(sqlite_url(Path(tmp) / "arranger.db"), create=True))
        try:
            world = World()
            for n, action in enumerate(START + steps):
                world.do(action)
                if n % every == 0:
                    world.written(store)
                    check_rebuilt(world, store)
            world.written(store)
            check_rebuilt(world, store)
        finally:
            asyncio.run(store.close())


def check_rebuilt(world: World, store: Store) -> None:
    """check_rebuilt: what each node holds, kept, equals what a controller loaded from the
    store finds (a restored node is not schedulable until its agent is back: usage only)."""
    jobs, nodes = asyncio.run(store.load(spec_from_json))
    loaded = Controller(world.c.config)
    loaded.restore(jobs, nodes, world.now, asyncio.run(store.load_queues()))
    kept = world.state.snapshot(world.now)
    rebuilt = build_snapshot(loaded, world.now)

    def usage(snap: Snapshot) -> dict[str, tuple[object, ...]]:
        return {
            n.name: (
                n.cpu_milli,
                n.memory_bytes,
                n.used_cpu_milli,
                n.used_memory_bytes,
                tuple((g.index, g.used_milli) for g in n.gpus),
            )
            for n in snap.nodes
        }

    assert usage(kept) == usage(rebuilt)
    assert sorted(j.id for j in kept.jobs) == sorted(j.id for j in rebuilt.jobs)
    holding = world.pods()
    assert holding == sorted(
        (job.id, pod.name)
        for job in loaded.jobs.values()
        for pod in job.pods.values()
        if pod.state.holds_resources
    )


def check(world: World, action: tuple[object, ...]) -> None:
    """check: after `action`, the kept snapshot, node arrays and job index equal those built
    from every record, and every job the clock may still change is live."""
    snap = world.state.snapshot(world.now)
    kept = canonical(snap)
    assert kept == canonical(build_snapshot(world.c, world.now)), action
    fresh = NodeArrays(snap.nodes)
    fresh.keep_label("zone")
    assert snap.arrays is not None and same_arrays(snap.arrays, fresh), action
    assert snap.index == index_jobs(snap.jobs, snap.queues), action
    live = {j.id for j in world.state.live_jobs()}
    for job in world.c.jobs.values():
        holds = any(p.state.holds_resources for p in job.pods.values())
        if holds or not (job.deleted or job.stage.finished):
            assert job.id in live, f"{job.id} may still change with time but is not live"


def test_nodes_join_and_leave_the_kept_snapshot_in_name_order() -> None:
    world = World()
    for action in [("register", "n3", 0), ("register", "n1", 4), ("submit", 1, "All", "1", "1")]:
        world.do(action)
    world.do(("cycle",))
    snap = world.state.snapshot(world.now)
    assert [n.name for n in snap.nodes] == ["n1", "n3"]
    n1 = snap.nodes[0]
    assert sum(g.used_milli for g in n1.gpus) == GPU_MILLI  # the leader's GPU is held on n1
    assert snap == build_snapshot(world.c, world.now)


def test_queues_the_controller_does_not_list_come_in_the_order_their_jobs_appear() -> None:
    world = World()
    world.do(("register", "n1", 8))
    for n, queue in enumerate(["qb", "qa", "qb", "default"]):
        text = SPEC.format(
            n=n, workers=1, minimum=1, policy="All", cpu="1", gpu="0", notice=0, priority=5
        )
        spec = parse_job(
            load_job_yaml(text.replace("metadata: {", f"metadata: {{queue: {queue}, "))
        )
        _, fx = world.c.submit(f"q{n}", spec, spec_to_json(spec), world.now)
        world.apply(fx)
    world.do(("cycle",))
    snap = world.state.snapshot(world.now)
    assert snap.index == index_jobs(snap.jobs, snap.queues)
    assert snap.index is not None and snap.index.unlisted == tuple(
        dict.fromkeys(j.queue for j in snap.jobs if j.queue != "default")
    )
    assert set(snap.index.unlisted) == {"qa", "qb"} and set(snap.index.held) >= {"qa", "qb"}
