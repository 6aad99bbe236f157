"""The openb CSV files become the core's NodeInfo and PodRequest."""

from __future__ import annotations

from pathlib import Path

import pytest

from arranger.sim.trace import MIB, TraceError, load_nodes, load_pods, load_trace

NODES = """sn,cpu_milli,memory_mib,gpu,model
openb-node-0001,96000,786432,8,V100M32
openb-node-0000,64000,262144,2,P100
openb-node-0002,32000,131072,0,
"""
PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
openb-pod-0017,88000,327680,8,1000,,Burstable,Succeeded,9437497,10769854,9437497
openb-pod-0022,4000,15258,1,220,,BE,Running,9679175,9973826,9679175
openb-pod-0035,16000,32768,1,1000,V100M16|V100M32,LS,Running,9967058,9968575,9967063
openb-pod-0040,2000,4096,0,0,nan,LS,Running,1,2,1
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_nodes_keep_file_order_and_get_numbered_gpus(tmp_path: Path) -> None:
    nodes = load_nodes(write(tmp_path, "nodes.csv", NODES))
    assert [n.name for n in nodes] == ["openb-node-0001", "openb-node-0000", "openb-node-0002"]
    big = nodes[0]
    assert (big.cpu_milli, big.memory_bytes) == (96000, 786432 * MIB)
    assert [(g.index, g.model, g.used_milli) for g in big.gpus] == [
        (i, "V100M32", 0) for i in range(8)
    ]
    assert nodes[2].gpus == ()  # a CPU-only node: no model needed


def test_pods_ask_for_num_gpu_times_gpu_milli(tmp_path: Path) -> None:
    pods = load_pods(write(tmp_path, "pods.csv", PODS))
    by_name = {p.name: p for p in pods}
    assert by_name["openb-pod-0017"].gpu_milli == 8000  # eight whole GPUs
    assert by_name["openb-pod-0022"].gpu_milli == 220  # a share of one GPU
    assert by_name["openb-pod-0022"].memory_bytes == 15258 * MIB
    spec = by_name["openb-pod-0035"]
    assert (spec.gpu_milli, spec.gpu_models) == (1000, frozenset({"V100M16", "V100M32"}))
    cpu_only = by_name["openb-pod-0040"]
    assert (cpu_only.gpu_milli, cpu_only.gpu_type) == (0, "")  # "nan": any model


def test_multigpu_files_have_only_five_columns(tmp_path: Path) -> None:
    text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\nopenb-pod-0000,12000,16384,4,1000\n"
    (only,) = load_pods(write(tmp_path, "multi.csv", text))
    assert (only.gpu_milli, only.gpu_type) == (4000, "")


def test_a_share_of_several_gpus_is_refused_with_its_line(tmp_path: Path) -> None:
    text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,1024,1,500\nb,1000,1024,2,500\n"
    with pytest.raises(TraceError, match=r"bad\.csv:3: a share of a GPU"):
        load_pods(write(tmp_path, "bad.csv", text))


def test_missing_file_and_missing_column_are_named(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such file"):
        load_nodes(tmp_path / "absent.csv")
    with pytest.raises(TraceError, match="missing column"):
        load_nodes(write(tmp_path, "short.csv", "sn,cpu_milli\nx,1000\n"))


def test_trace_capacity_counts_every_gpu(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, "n.csv", NODES), write(tmp_path, "default.csv", PODS))
    assert (trace.name, trace.nodes_name, trace.capacity_milli) == ("default", "n", 10_000)
