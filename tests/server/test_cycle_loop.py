"""The scheduling loop around the core: the API is answered while a cycle computes, a plan is
applied only where it still fits, and cycles run on change or when time could change a plan.

Real servers on 127.0.0.1, real agents where pods must run; the long cycle is an extra action
that waits until the test lets it go (no sleep: it holds on an event with a deadline).
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import threading
import time
from pathlib import Path

import pytest

from arranger.client.sdk import AsyncClient
from arranger.sched import Placement, Plan, SchedulerConfig
from arranger.sched.framework import action
from arranger.sched.session import Session
from arranger.server.app import ArrangerServer
from arranger.server.config import ConfigError, load_server_config
from arranger.server.schedule_loop import stale_placements
from arranger.server.snapshot import SchedulingState
from arranger.states import PodState
from tests.conftest import FAST, bare_server, eventually, job_spec, running_cluster
from tests.server.test_controller import Harness

entered = threading.Event()
release = threading.Event()


@action("hold-for-test")
def hold_for_test(session: Session) -> None:
    """hold-for-test: a cycle that lasts until the test says (30 s at most)."""
    entered.set()
    release.wait(30.0)


async def test_submits_and_lists_are_answered_while_a_long_cycle_computes(
    tmp_path: Path,
) -> None:
    entered.clear()
    release.clear()
    actions = ("hold-for-test", *SchedulerConfig().actions)
    config = dataclasses.replace(FAST, scheduler=SchedulerConfig(actions=actions))
    try:
        async with (
            bare_server(tmp_path / "server", config) as server,
            AsyncClient(f"127.0.0.1:{server.port}", timeout_s=10) as client,
        ):
            await client.submit(job_spec("first", ["true"]))
            await eventually(entered.is_set, what="a cycle holding in its action")
            cycles = server.cycles
            # The cycle is held: the API still answers, and what it stores is listed.
            await client.submit(job_spec("second", ["true"]))
            names = [j.name for j in await client.jobs()]
            assert sorted(names) == ["first", "second"]
            assert (await client.get("second")).metadata.name == "second"
            assert not release.is_set() and server.cycles == cycles  # still in that cycle
            release.set()
            await eventually(lambda: server.cycles > cycles, what="the held cycle ending")
    finally:
        release.set()


def test_placements_on_a_node_that_changed_meanwhile_are_dropped_whole() -> None:
    """The plan applier re-checks each node against the records as they are when the plan
    comes back: a node cordoned, or one whose room was taken, drops every placement of the
    jobs that had a pod there."""
    h = Harness()
    state = SchedulingState(h.c)
    plan = Plan([Placement("j", f"rl-{p}", "n1") for p in ("learner", "actors-0")])
    plan.placements.append(Placement("j", "rl-actors-1", "n2"))
    assert stale_placements(h.c, state, plan) == set()
    h.c.cordon("n2", True, h.now)
    assert stale_placements(h.c, state, plan) == {"j"}
    h.c.cordon("n2", False, h.now)
    # n1 has 8 cores; a plan asking for 9 there (made against other records) is refused.
    too_much = Plan([Placement("j", f"rl-{p}", "n1") for p in ("learner", "actors-0")] * 5)
    h.c.nodes["n1"].cpu_milli = 1000  # the node came back smaller
    assert stale_placements(h.c, state, too_much) == {"j"}
    fx = h.c.apply_plan(plan, h.now, skip={"j"})
    assert not fx.pods and all(p.state == PodState.PENDING for p in h.job.pods.values())
    # What pods placed meanwhile hold counts: the kept state is told every change.
    h.c.nodes["n1"].cpu_milli = 8000
    cpu = h.job.spec.template_of("actors").resources.cpu_milli
    fills = Plan([Placement("j", "rl-actors-2", "n1")] * (8000 // cpu))
    assert stale_placements(h.c, state, fills) == set()
    state.changed(h.place(learner="n1"))
    assert h.pod("learner").state.holds_resources
    assert stale_placements(h.c, state, fills) == {"j"}


@pytest.mark.e2e
async def test_a_reservation_grows_on_an_otherwise_idle_cluster(tmp_path: Path) -> None:
    """Nothing changes after the wide job starts waiting: its cycles come from the plans' wake
    times alone (the starvation threshold, then one per node locked)."""
    config = dataclasses.replace(
        FAST, scheduler=dataclasses.replace(FAST.scheduler, starvation_threshold_s=0.5)
    )
    waits = [sys.executable, "-c", "import signal; signal.pause()"]  # until it is stopped
    async with (
        running_cluster(tmp_path / "cluster", config=config) as cluster,
        AsyncClient(cluster.address, timeout_s=10) as client,
    ):
        # Each node (4 cores) runs one pod of the hog's; the wide job needs two nodes
        # drained, and it may not evict the hog (higher priority).
        await client.submit(job_spec("hog", waits, workers=1, cpu=3, priority=9))
        server = cluster.server
        await eventually(
            lambda: (
                sum(
                    p.state == PodState.RUNNING
                    for p in server.controller.view.find("hog").pods.values()
                )
                == 2
            ),  # type: ignore[union-attr]
            what="the hog running on both nodes",
        )

        def reserved() -> int:
            reservation = server.controller.reservation
            return len(reservation.nodes) if reservation is not None else 0

        def cycles(cause: str) -> float:
            found = server.metrics.registry.get_sample_value(
                "arranger_scheduling_cycles_total", {"cause": cause}
            )
            return found or 0.0

        by_change, by_time = cycles("change"), cycles("time")
        await client.submit(job_spec("wide", waits, workers=1, cpu=3, priority=1, minWorkersNum=1))
        await eventually(lambda: reserved() == 2, what="both nodes locked for the wide job")
        # Nothing changed after the submit: its cycle found no room, and the cycles that locked
        # the nodes came at the plans' wake times (the starvation threshold, then the next
        # node), at least one for each node.
        assert cycles("change") <= by_change + 1 and cycles("time") >= by_time + 2
        await client.stop("hog")
        await client.delete("wide")


async def test_a_flood_of_changes_begins_cycles_at_most_once_per_interval(tmp_path: Path) -> None:
    """Changes that keep coming (here, a trigger at every poll) are gathered: each cycle begins
    at least minCycleIntervalSeconds after the one before."""
    interval = 0.25
    config = dataclasses.replace(FAST, schedule_period_s=1.0, min_cycle_interval_s=interval)
    server = ArrangerServer(
        dataclasses.replace(config, listen="127.0.0.1:0", data_dir=tmp_path / "server")
    )
    began: list[float] = []
    run_cycle = server.loop.run_cycle

    async def timed() -> None:
        began.append(time.monotonic())
        await run_cycle()

    server.loop.run_cycle = timed  # type: ignore[method-assign]
    async with bare_server(tmp_path / "server", server=server):
        await eventually(lambda: server.trigger() or len(began) >= 5, what="five cycles")
    gaps = [b - a for a, b in itertools.pairwise(began)]
    assert gaps and min(gaps) >= interval - 0.005, gaps


@pytest.mark.parametrize("value", ["-0.1", "2", ".nan", "fast", "true"])
def test_the_cycle_interval_lies_within_the_schedule_period(tmp_path: Path, value: str) -> None:
    (tmp_path / "server.yaml").write_text(f"insecure: true\nminCycleIntervalSeconds: {value}\n")
    with pytest.raises(ConfigError, match="minCycleIntervalSeconds"):
        load_server_config(tmp_path / "server.yaml")
