"""What the server makes of unhealthy GPUs, with no network: taken from Register and every
heartbeat, an event once per GPU that turns unhealthy (and one when it heals, its agent having
restarted), handed to the core, and a placement on one dropped when the plan comes back."""

from __future__ import annotations

from arranger.sched import GpuShare, Placement, Plan
from arranger.server.agent_messages import GPU_PROBLEM_CHARS, registration_from_proto
from arranger.server.controller import Controller, ControllerConfig
from arranger.server.effects import Effects
from arranger.server.nodes import NodeRegistration
from arranger.server.schedule_loop import stale_placements
from arranger.server.snapshot import SchedulingState, node_info
from arranger.v1 import agent_pb2, node_pb2
from tests.server.test_controller import Harness

XID = "XID 79: GPU has fallen off the bus"
ECC = "uncorrectable ECC errors: 3 new"
NEWS = "; nothing more is placed on it (pods running on it run on)"


def register(*problems: tuple[int, str]) -> NodeRegistration:
    """register: node n1's registration, 2 GPUs, with these (index, reason) unhealthy."""
    msg = agent_pb2.Register(
        node_name="n1",
        address="10.0.0.1",
        agent_version="test",
        capacity=node_pb2.NodeResources(cpu=8, memory=2**33, gpu=2),
        gpus=[node_pb2.Gpu(index=i, uuid=f"GPU-{i}", model="A100", memory=2**35) for i in range(2)],
        gpu_problems=[agent_pb2.GpuProblem(index=i, reason=r) for i, r in problems],
    )
    return registration_from_proto(msg)


def gpu_events(fx: Effects) -> list[tuple[str, str]]:
    return [(e.kind, e.message) for e in fx.events if e.kind.startswith("Gpu")]


def test_a_gpu_turning_unhealthy_is_told_once_and_healing_once() -> None:
    c = Controller(ControllerConfig())
    fx = c.node_registered(register((1, XID)), 100.0)
    assert gpu_events(fx) == [("GpuUnhealthy", f"node n1 GPU 1: {XID}{NEWS}")]
    assert [g.problem for g in c.nodes["n1"].gpus] == ["", XID]
    assert not c.gpu_problems("n1", {1: XID}, 101.0)  # every heartbeat says it: no news
    fx = c.gpu_problems("n1", {0: ECC, 1: XID}, 102.0)
    assert gpu_events(fx) == [("GpuUnhealthy", f"node n1 GPU 0: {ECC}{NEWS}")]
    assert fx.nodes == {"n1"} and fx.schedule  # the snapshot looks at the node again
    info = node_info(c.nodes["n1"], {}, {}, {})
    assert [(g.index, g.problem) for g in info.gpus] == [(0, ECC), (1, XID)]
    assert not c.node_registered(register((0, ECC), (1, XID)), 103.0).events  # reconnected
    fx = c.node_registered(register(), 104.0)  # its agent restarted: every GPU healthy
    assert gpu_events(fx) == [
        ("GpuHealthy", f"node n1 GPU {i} takes pods again: its agent finds it healthy")
        for i in (0, 1)
    ]
    assert not c.gpu_problems("n9", {0: XID}, 105.0)  # a node not known: nothing


def test_an_agents_reason_is_kept_short_and_never_empty() -> None:
    reasons = [g.problem for g in register((0, "x" * 1000), (1, "")).gpus]
    assert reasons == ["x" * GPU_PROBLEM_CHARS, "unhealthy"]


def test_a_placement_on_a_gpu_that_turned_unhealthy_meanwhile_is_dropped() -> None:
    h = Harness()
    h.c.node_registered(register(), h.now)
    state = SchedulingState(h.c)
    on = {i: Plan([Placement("j", "rl-learner", "n1", (GpuShare(i, 1000),))]) for i in (0, 1)}
    assert stale_placements(h.c, state, on[1]) == set()
    state.changed(h.c.gpu_problems("n1", {1: XID}, h.now))
    assert stale_placements(h.c, state, on[1]) == {"j"}
    assert stale_placements(h.c, state, on[0]) == set()
