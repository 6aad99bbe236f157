"""gpuspec makes the FGD paper's `gpuspec` family of traces from a base trace: a given share of
the GPU pods is constrained to one GPU model.

The shipped openb_pod_list_gpuspec05 and gpuspec10 are the default pod list with 5.2 % and
10.4 % of its GPU pods (never a CPU-only pod) given a `gpu_spec`; nothing else differs. The
paper (Sec. 6.5) constrains a share of the GPU pods to GPU types of the cluster. Here, with
random.Random(seed):

- the GPU pods, sorted by name, are shuffled once and the first round(ratio x their number)
  are constrained, so a higher ratio constrains a superset of the pods a lower one does;
- each constrained pod gets the model of a node drawn uniformly from the node list's nodes
  that could hold it when empty (GPUs, cores, memory; any GPU node if none could): models are
  drawn as often as nodes of them there are, and a constrained pod stays placeable.

One draw is made for every GPU pod whether or not it is constrained, so a pod's model does not
depend on the ratio either. A pod that already names models keeps them.
"""

from __future__ import annotations

import random
from dataclasses import replace

from arranger.sched.snapshot import GPU_MILLI, NodeInfo, PodRequest
from arranger.sim.trace import Trace


def gpuspec_name(base: str, ratio: float) -> str:
    """gpuspec_name: the name of the base trace's variant at `ratio` ("...+gpuspec25")."""
    return f"{base}+gpuspec{round(ratio * 100):02d}"


def constrain(
    pods: tuple[PodRequest, ...], nodes: tuple[NodeInfo, ...], ratio: float, seed: int
) -> tuple[PodRequest, ...]:
    """constrain: the pods, in the same order, with round(ratio x GPU pods) of the GPU pods
    given one GPU model drawn from `nodes` (ValueError for a ratio outside 0..1)."""
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"the gpuspec ratio must be within 0..1, not {ratio}")
    gpu_nodes = [n for n in nodes if n.gpus]
    gpu_pods = sorted((p for p in pods if p.gpu_milli > 0), key=lambda p: p.name)
    if not gpu_nodes or not gpu_pods:
        return pods
    rng = random.Random(seed)
    rng.shuffle(gpu_pods)
    chosen = round(ratio * len(gpu_pods))
    models: dict[str, str] = {}
    fitting: dict[tuple[int, int, int], list[NodeInfo]] = {}  # by what the pod asks for
    for position, pod in enumerate(gpu_pods):
        asks = (pod.gpu_milli, pod.cpu_milli, pod.memory_bytes)
        if asks not in fitting:
            fitting[asks] = hosts(pod, gpu_nodes)
        model = rng.choice(fitting[asks]).gpus[0].model
        if position < chosen and not pod.gpu_type:
            models[pod.name] = model
    return tuple(replace(p, gpu_type=models[p.name]) if p.name in models else p for p in pods)


def hosts(pod: PodRequest, nodes: list[NodeInfo]) -> list[NodeInfo]:
    """hosts: the nodes that could hold the pod when empty (all of them if none could)."""
    whole = max(1, pod.gpu_milli // GPU_MILLI)
    fit = [
        n
        for n in nodes
        if len(n.gpus) >= whole
        and n.cpu_milli >= pod.cpu_milli
        and n.memory_bytes >= pod.memory_bytes
    ]
    return fit or nodes


def gpuspec_trace(trace: Trace, ratio: float, seed: int) -> Trace:
    """gpuspec_trace: the trace with its pods constrained at `ratio` (see constrain)."""
    pods = constrain(trace.pods, trace.nodes, ratio, seed)
    return replace(trace, name=gpuspec_name(trace.name, ratio), pods=pods)
