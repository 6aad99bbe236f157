"""environment: a pod's whole environment (the contract of DESIGN §6), made by one pure function.

`pod_environment` layers, each over the one before:

1. what the pod inherits of the agent's own environment (INHERITED_ENV, with the configured
   PATH prefix): a plain process only, never a container (its image has its PATH and HOME);
2. HOME, USER and LOGNAME of the account a plain process runs as, when that is not the agent's;
3. the order's `env` (the template's, plus the job's part of the contract, such as the
   rendezvous variables the server gives a worker), which wins over 1 and 2;
4. the agent's own variables, which the order cannot override: ARRANGER_NODE_NAME,
   ARRANGER_SCRATCH_DIR, ARRANGER_VOLUME_<NAME> (a container's mount paths),
   ARRANGER_PORT_<NAME> for each port, ARRANGER_LEADER_HOST/PORT/ADDR for a leader,
   CUDA_VISIBLE_DEVICES, and for a share of one GPU ARRANGER_GPU_FRACTION (and
   CUDA_MPS_ACTIVE_THREAD_PERCENTAGE where the node is configured `mps`);
5. for a plain process whose share an MPS daemon holds (see shares): the framework caps
   XLA_PYTHON_CLIENT_MEM_FRACTION and TF_FORCE_GPU_ALLOW_GROWTH unless the order set them,
   and, whatever it set, CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY, ARRANGER_GPU_MEMORY_BYTES
   and CUDA_VISIBLE_DEVICES as the daemon's server numbers the GPU;
6. for a container: CUDA_VISIBLE_DEVICES naming its GPUs as it sees them (by UUID where every
   one is known, else numbered from 0) and NVIDIA_VISIBLE_DEVICES, the same or "void" when it
   has no GPU, whatever the order set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from arranger.agent.config import PodUser
from arranger.agent.orders import LaunchOrder
from arranger.agent.runtime import CONTAINER_SCRATCH
from arranger.agent.shares import HeldShare
from arranger.spec import env_name

# Variables of the agent's own environment a pod inherits; everything else comes from the spec.
INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "USER", "LOGNAME", "SHELL", "TMPDIR")


def inherited_env(environ: Mapping[str, str], path_prepend: Sequence[str] = ()) -> dict[str, str]:
    """inherited_env: what a plain process inherits of `environ` (the agent's own): the
    INHERITED_ENV variables it has, with `path_prepend` before its PATH (or os.defpath)."""
    base = {k: v for k in INHERITED_ENV if (v := environ.get(k)) is not None}
    if path_prepend:
        base["PATH"] = os.pathsep.join([*path_prepend, base.get("PATH", os.defpath)])
    return base


@dataclass(frozen=True)
class NodeEnvironment:
    """NodeEnvironment: what this node puts in every pod's environment: its name, the address
    a leader is reached at, what a plain process inherits (see inherited_env), whether the
    node is configured `mps`, and the UUIDs of its GPUs by index (how a container names them)."""

    node_name: str
    address: str
    inherited: Mapping[str, str] = field(default_factory=dict)
    mps: bool = False
    gpu_uuids: Mapping[int, str] = field(default_factory=dict)


def pod_environment(
    node: NodeEnvironment,
    order: LaunchOrder,
    ports: Mapping[str, int],
    scratch: Path,
    *,
    container: bool = False,
    user: PodUser | None = None,
    held: HeldShare | None = None,
) -> dict[str, str]:
    """pod_environment: the whole environment of `order`'s pod, given its allocated `ports`,
    its `scratch` directory, whether it runs in a container, the account it runs as (None:
    the agent's own) and the GPU share an MPS daemon holds it to (None: none). See the
    module's doc for what wins over what."""
    env = {} if container else dict(node.inherited)
    if user is not None and not container:
        env.update(HOME=user.home, USER=user.name, LOGNAME=user.name)
    env.update(order.env)
    env["ARRANGER_NODE_NAME"] = node.node_name
    env["ARRANGER_SCRATCH_DIR"] = CONTAINER_SCRATCH if container else str(scratch)
    if container:
        for volume in order.volumes:
            env[f"ARRANGER_VOLUME_{env_name(volume.name)}"] = volume.mount_path
    for name, number in ports.items():
        env[f"ARRANGER_PORT_{env_name(name)}"] = str(number)
    if order.leader_port_name and order.leader_port_name in ports:
        port = ports[order.leader_port_name]
        env["ARRANGER_LEADER_HOST"] = node.address
        env["ARRANGER_LEADER_PORT"] = str(port)
        env["ARRANGER_LEADER_ADDR"] = f"{node.address}:{port}"
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g.index) for g in order.gpus)
    if len(order.gpus) == 1 and order.gpus[0].share < 1:
        share = order.gpus[0].share
        env["ARRANGER_GPU_FRACTION"] = f"{share:g}"
        if node.mps:  # NVIDIA MPS caps the share of the GPU's threads the process may use
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, round(share * 100)))
    if held is not None and not container:
        env.update(held.pod_env(env))
    if container:
        gpus = [g.index for g in order.gpus]
        if gpus:  # the container sees its own devices only: by UUID, or numbered from 0
            if all(i in node.gpu_uuids for i in gpus):
                env["CUDA_VISIBLE_DEVICES"] = ",".join(node.gpu_uuids[i] for i in gpus)
            else:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(gpus)))
        # An NVIDIA hook, where installed, reads this; "void": no GPU, whatever the image says.
        env["NVIDIA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES") or "void"
    return env
