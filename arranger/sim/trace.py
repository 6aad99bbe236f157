"""trace reads the openb CSV files of the Alibaba GPU trace into the core's NodeInfo and
PodRequest.

Node list (`sn,cpu_milli,memory_mib,gpu,model`): one NodeInfo per row, `gpu` GPUs of `model`
numbered 0..gpu-1. Pod list (`name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]`; the
multigpu files stop after gpu_milli): `gpu_milli` is the share of EACH GPU, so the pod asks for
num_gpu * gpu_milli milli-GPUs; a share (below 1000) only with num_gpu = 1, which is what the
core's PodRequest can express. `gpu_spec` ("V100M16|V100M32", empty or "nan": any) becomes the
pod's gpu_type. Memory is MiB in the files, bytes in the core.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from arranger.sched.snapshot import GPU_MILLI, GpuInfo, NodeInfo, PodRequest
from arranger.states import Role

MIB = 2**20
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
EMPTY = ("", "nan", "NaN", "None")


class TraceError(ValueError):
    """TraceError names the file (and line) that cannot be read."""


@dataclass(frozen=True)
class Trace:
    """Trace is one cluster and one pod list: `nodes` as NodeInfo, `pods` in file order.

    `capacity_milli` is the cluster's GPUs in milli-GPUs (the denominator of arrived % and
    allocated %); `name` is the pod list's file stem, `nodes_name` the node list's.
    """

    name: str
    nodes_name: str
    nodes: tuple[NodeInfo, ...]
    pods: tuple[PodRequest, ...]

    @property
    def capacity_milli(self) -> int:
        return sum(len(n.gpus) for n in self.nodes) * GPU_MILLI


def load_trace(nodes_csv: Path, pods_csv: Path) -> Trace:
    """load_trace reads a node list and a pod list (TraceError if either is missing or bad)."""
    return Trace(pods_csv.stem, nodes_csv.stem, load_nodes(nodes_csv), load_pods(pods_csv))


def load_nodes(path: Path) -> tuple[NodeInfo, ...]:
    """load_nodes reads an openb node list."""
    nodes = []
    for line, row in _rows(path, NODE_COLUMNS):
        try:
            count = int(row["gpu"])
            model = "" if row["model"] in EMPTY else row["model"]
            if count < 0 or (count and not model):
                raise ValueError("a node with GPUs needs a model")
            nodes.append(
                NodeInfo(
                    name=row["sn"],
                    cpu_milli=int(row["cpu_milli"]),
                    memory_bytes=int(row["memory_mib"]) * MIB,
                    gpus=tuple(GpuInfo(i, model) for i in range(count)),
                )
            )
        except (TypeError, ValueError) as exc:
            raise TraceError(f"{path}:{line}: {exc}") from exc
    return tuple(nodes)


def load_pods(path: Path) -> tuple[PodRequest, ...]:
    """load_pods reads an openb pod list, in file order."""
    pods = []
    for line, row in _rows(path, POD_COLUMNS):
        try:
            pods.append(pod_request(row))
        except (TypeError, ValueError) as exc:
            raise TraceError(f"{path}:{line}: {exc}") from exc
    return tuple(pods)


def pod_request(row: dict[str, str]) -> PodRequest:
    """pod_request turns one pod-list row into a PodRequest (ValueError if it is not one the
    trace's format allows)."""
    count, share = int(row["num_gpu"]), int(row["gpu_milli"])
    if count < 0 or not 0 <= share <= GPU_MILLI:
        raise ValueError(f"bad GPU request: num_gpu {count}, gpu_milli {share}")
    if count > 1 and share != GPU_MILLI:
        raise ValueError(f"a share of a GPU ({share}) with num_gpu {count} > 1")
    spec = row.get("gpu_spec") or ""
    return PodRequest(
        name=row["name"],
        role=Role.WORKER,
        rank=0,
        cpu_milli=int(row["cpu_milli"]),
        memory_bytes=int(row["memory_mib"]) * MIB,
        gpu_milli=count * share,
        gpu_type="" if spec in EMPTY else spec,
    )


def _rows(path: Path, columns: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    if not path.is_file():
        raise TraceError(f"no such file: {path}")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in columns if c not in (reader.fieldnames or ())]
        if missing:
            raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")
        for row in reader:
            yield reader.line_num, row
