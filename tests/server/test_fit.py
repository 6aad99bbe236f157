"""capacity_warnings: why a job cannot run on the cluster as it is, said at submit."""

from __future__ import annotations

from typing import Any

from arranger.client.specfile import load_job_data
from arranger.server.fit import FLEET_AGE_S, Fleet, FleetCache, capacity_warnings
from arranger.server.model import GpuRecord, NodeRecord
from arranger.server.validation import parse_job
from arranger.spec import JobSpec
from tests.conftest import job_spec

GI = 2**30


def node(
    name: str, cpu: int = 4, memory_gi: int = 8, gpus: int = 0, model: str = "A100", **fields: Any
) -> NodeRecord:
    gpu_list = [GpuRecord(i, f"{name}-{i}", model, 40 * GI) for i in range(gpus)]
    fields.setdefault("connected", True)
    return NodeRecord(name, "127.0.0.1", cpu * 1000, memory_gi * GI, gpu_list, **fields)


def spec(leader: dict[str, Any] | None = None, workers: int = 1, **body: Any) -> JobSpec:
    doc = job_spec("j", leader=["true"], workers=workers, **body)
    doc["spec"]["leader"]["template"].update(leader or {})
    return parse_job(load_job_data(doc))


def test_a_job_that_fits_gets_no_warning() -> None:
    assert capacity_warnings(spec(), [node("a"), node("b")]) == []


def test_a_pod_larger_than_every_node_is_named_with_the_largest() -> None:
    nodes = [node("a", gpus=2), node("b", cpu=16)]
    big_gpu = spec({"resources": {"cpu": 1, "memory": "1Gi", "gpu": 4}})
    assert capacity_warnings(big_gpu, nodes) == [
        "the leader needs 4 GPUs (the largest node has 2 GPUs)"
    ]
    big_cpu = spec({"resources": {"cpu": 32, "memory": "1Gi"}})
    assert capacity_warnings(big_cpu, nodes) == [
        "the leader needs 32 CPUs (the largest node has 16 CPUs)"
    ]
    everything = spec({"resources": {"cpu": 32, "memory": "64Gi", "gpu": 4}})
    assert capacity_warnings(everything, nodes) == [
        "the leader needs 32 CPUs (the largest node has 16 CPUs), 64Gi of memory (the largest "
        "node has 8Gi) and 4 GPUs (the largest node has 2 GPUs)"
    ]
    both = spec({"resources": {"cpu": 16, "memory": "1Gi", "gpu": 1}})
    assert capacity_warnings(both, nodes) == [
        "the leader needs 16 CPUs, 1Gi of memory and 1 GPU on one node; no Ready node has all of "
        "them"
    ]


def test_selectors_gpu_types_and_images_narrow_the_nodes() -> None:
    nodes = [node("a", gpus=8, model="V100", labels={"zone": "a"})]
    selected = spec({"nodeSelector": {"zone": "b"}})
    assert capacity_warnings(selected, nodes) == [
        "the leader needs nodeSelector zone=b; no Ready node has those labels"
    ]
    typed = spec({"resources": {"cpu": 1, "memory": "1Gi", "gpu": 1, "gpuType": "A100"}})
    assert capacity_warnings(typed, nodes) == [
        "the leader needs 1 A100 GPU (the largest node has 0 A100 GPUs)"
    ]
    image = spec({"image": "docker.io/library/python:3.11"})
    assert capacity_warnings(image, nodes) == [
        "the leader runs image docker.io/library/python:3.11; no Ready node has a container runtime"
    ]


def test_a_gang_larger_than_the_cluster_is_named_with_its_total() -> None:
    gang = spec(workers=20, minWorkersNum=16, cpu=1)
    assert capacity_warnings(gang, [node("a"), node("b")]) == [
        "the gang minimum (17 pods) needs 17 CPUs (the cluster has 8 in all) on 2 Ready nodes"
    ]


def test_only_ready_schedulable_nodes_count() -> None:
    nodes = [node("a", cordoned=True, cpu=64), node("b", connected=False, cpu=64), node("c")]
    big = spec({"resources": {"cpu": 8, "memory": "1Gi"}})
    assert capacity_warnings(big, nodes) == [
        "the leader needs 8 CPUs (the largest node has 4 CPUs)"
    ]
    assert capacity_warnings(big, nodes[:2]) == [
        "no Ready, schedulable node has joined yet; the job waits for one"
    ]


def test_the_fleet_is_reused_until_the_node_count_changes_or_it_ages() -> None:
    nodes = [node("a"), node("b", gpus=2)]
    builds: list[int] = []
    now = [0.0]

    def listed() -> list[NodeRecord]:
        builds.append(len(nodes))
        return list(nodes)

    cache = FleetCache(listed, lambda: len(nodes), lambda: now[0])
    first = cache.fleet()
    assert cache.fleet() is first and builds == [2]
    assert first == Fleet.of(nodes) and first.total_gpus == 2
    nodes.append(node("c", cpu=64))
    assert cache.fleet().total_cpu == 72_000 and builds == [2, 3]  # a node joined
    nodes[2].cordoned = True  # seen once the fleet ages, not before
    assert cache.fleet().total_cpu == 72_000
    now[0] += FLEET_AGE_S + 0.1
    assert cache.fleet().total_cpu == 8_000 and builds == [2, 3, 3]
    big = spec({"resources": {"cpu": 32}})
    assert capacity_warnings(big, cache.fleet()) == [
        "the leader needs 32 CPUs (the largest node has 4 CPUs)"
    ]
