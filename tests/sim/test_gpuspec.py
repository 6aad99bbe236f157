"""The gpuspec family: a share of the GPU pods constrained to a model of the node list."""

from __future__ import annotations

import pytest

from arranger.sched.snapshot import GpuInfo, NodeInfo, PodRequest
from arranger.sim.gpuspec import constrain, gpuspec_name, gpuspec_trace
from arranger.sim.trace import Trace
from arranger.states import Role

GIB = 2**30


def gpu_node(name: str, model: str, gpus: int, cpu: int = 96_000) -> NodeInfo:
    return NodeInfo(name, cpu, 512 * GIB, gpus=tuple(GpuInfo(i, model) for i in range(gpus)))


NODES = (
    gpu_node("n0", "G2", 8),
    gpu_node("n1", "T4", 2),
    gpu_node("n2", "T4", 2),
    gpu_node("n3", "P100", 2, cpu=16_000),
    NodeInfo("cpu", 64_000, 256 * GIB),
)


def request(name: str, gpu_milli: int, cpu: int = 4000, gpu_type: str = "") -> PodRequest:
    return PodRequest(name, Role.WORKER, 0, cpu, GIB, gpu_milli, gpu_type=gpu_type)


PODS = tuple(
    request(f"p{i:03d}", gpu_milli=(0, 250, 1000, 8000)[i % 4], cpu=(2000, 4000, 32_000)[i % 3])
    for i in range(400)
)


def constrained(pods: tuple[PodRequest, ...]) -> list[PodRequest]:
    return [p for p in pods if p.gpu_type]


@pytest.mark.parametrize("ratio", [0.0, 0.05, 0.25, 0.5, 1.0])
def test_the_share_asked_for_of_the_gpu_pods_is_constrained(ratio: float) -> None:
    pods = constrain(PODS, NODES, ratio, seed=1)
    gpu_pods = [p for p in PODS if p.gpu_milli]
    assert len(constrained(pods)) == round(ratio * len(gpu_pods))
    assert all(p.gpu_milli for p in constrained(pods))  # never a CPU-only pod
    # Nothing else changes, and the order is kept.
    assert [(p.name, p.request) for p in pods] == [(p.name, p.request) for p in PODS]


def test_models_come_from_nodes_that_could_hold_the_pod() -> None:
    pods = constrain(PODS, NODES, 1.0, seed=3)
    models = {p.gpu_type for p in constrained(pods)}
    assert models <= {"G2", "T4", "P100"}
    for p in constrained(pods):
        assert len(p.gpu_models) == 1
        if p.gpu_milli == 8000:  # only the 8-GPU node holds it
            assert p.gpu_type == "G2"
        if p.cpu_milli > 16_000:  # too many cores for the P100 node
            assert p.gpu_type != "P100"
    # Drawn per node: T4 has two nodes, so it comes up more often than P100 among shares.
    shares = [p.gpu_type for p in constrained(pods) if p.gpu_milli == 250 and p.cpu_milli <= 16_000]
    assert shares.count("T4") > shares.count("P100") > 0


def test_the_draw_is_deterministic_per_seed_and_nested_across_ratios() -> None:
    assert constrain(PODS, NODES, 0.3, seed=7) == constrain(PODS, NODES, 0.3, seed=7)
    assert constrain(PODS, NODES, 0.3, seed=7) != constrain(PODS, NODES, 0.3, seed=8)
    low = {p.name: p.gpu_type for p in constrained(constrain(PODS, NODES, 0.2, seed=7))}
    high = {p.name: p.gpu_type for p in constrained(constrain(PODS, NODES, 0.4, seed=7))}
    assert low.items() <= high.items()  # the same pods with the same models, and more


def test_a_pod_that_names_models_keeps_them() -> None:
    pods = (request("a", 1000, gpu_type="V100M16|V100M32"), *PODS)
    assert constrain(pods, NODES, 1.0, seed=0)[0].gpu_type == "V100M16|V100M32"


def test_a_ratio_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"within 0\.\.1"):
        constrain(PODS, NODES, 1.5, seed=0)


def test_the_trace_is_renamed_after_its_ratio() -> None:
    trace = gpuspec_trace(Trace("openb_pod_list_default", "nodes", NODES, PODS), 0.25, seed=0)
    assert trace.name == gpuspec_name("openb_pod_list_default", 0.25)
    assert trace.name == "openb_pod_list_default+gpuspec25"
    assert len(constrained(trace.pods)) == 75
