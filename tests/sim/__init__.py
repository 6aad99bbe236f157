"""Tests of the trace simulator (arranger.sim); small builders shared by them."""

from __future__ import annotations

from collections.abc import Sequence

from arranger.sched.fragmentation import request_mix
from arranger.sched.plan import Placement
from arranger.sched.snapshot import GpuInfo, NodeInfo, PodRequest
from arranger.sim.policies import SimSession
from arranger.sim.protocol import open_session, place
from arranger.states import Role

GI = 2**30


def node(
    name: str,
    cpu: float = 32,
    gpus: int = 0,
    model: str = "T4",
    used: Sequence[int] = (),
    used_cpu: float = 0,
    memory_gi: float = 256,
) -> NodeInfo:
    """node: `gpus` GPUs of `model`, `used` milli-GPUs taken on the first ones."""
    taken = [*used, *[0] * (gpus - len(used))]
    return NodeInfo(
        name=name,
        cpu_milli=round(cpu * 1000),
        memory_bytes=round(memory_gi * GI),
        gpus=tuple(GpuInfo(i, model, taken[i]) for i in range(gpus)),
        used_cpu_milli=round(used_cpu * 1000),
    )


def pod(
    name: str, cpu: float = 1, gpu: float = 0, gpu_type: str = "", memory_gi: float = 1
) -> PodRequest:
    """pod: `gpu` GPUs (below 1: a share of one GPU)."""
    return PodRequest(
        name, Role.WORKER, 0, round(cpu * 1000), round(memory_gi * GI), round(gpu * 1000), gpu_type
    )


def session(
    nodes: Sequence[NodeInfo], plugin: str, seed: int = 0, mix: Sequence[PodRequest] = ()
) -> SimSession:
    """session: the nodes as a simulator session scored by `plugin`, FGD's mix from `mix`."""
    return open_session(tuple(nodes), plugin, seed, request_mix(mix))


def put(sim: SimSession, p: PodRequest) -> tuple[str, tuple[int, ...]] | None:
    """put places the pod and says where: (node, GPU indices), or None."""
    placed: Placement | None = place(sim, p)
    if placed is None:
        return None
    return placed.node, tuple(g.index for g in placed.gpus)


# The mix: half the pods want 4 cores and half a GPU (class A), a quarter 16 cores and a whole
# GPU (B), a quarter 1 core and no GPU (C).
MIX_PODS = [
    pod("a1", cpu=4, gpu=0.5),
    pod("a2", cpu=4, gpu=0.5),
    pod("b", cpu=16, gpu=1),
    pod("c"),
]
# 8 cores free; GPUs free 1000, 1000, 500, 200 (sum 2700).
TINY = node("tiny", cpu=32, used_cpu=24, gpus=4, used=[0, 0, 500, 800])
