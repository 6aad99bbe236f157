"""orders: what the server orders this agent to do, as the agent holds it.

The wire's LaunchPod and KillPod become these frozen values once, where the agent reads its
stream (agent.py); nothing else of the agent sees protobuf. Resources are in the wire's units:
`cpu_cores` (cores, fractional), `memory_bytes`; a GPU grant's `share` is 1 for a whole GPU,
below 1 for a share of one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuGrant:
    """GpuGrant: one GPU of the node by its index, whole (share 1) or a share below 1."""

    index: int
    share: float = 1.0


@dataclass(frozen=True)
class Volume:
    """Volume: a host directory; a process sees its path in ARRANGER_VOLUME_<NAME>, a
    container has it mounted at `mount_path`."""

    name: str
    host_path: str
    mount_path: str
    read_only: bool = False


@dataclass(frozen=True)
class Package:
    """Package: a job's shipped working directory, by its SHA-256 and size in bytes."""

    sha256: str
    size: int


@dataclass(frozen=True)
class LaunchOrder:
    """LaunchOrder: start attempt `attempt` of pod `uid` (`<job id>/<pod name>`).

    `env` is the template's environment plus the job's part of the contract; `ports` maps each
    port name to a number to reuse (> 0) or 0 (the agent allocates one). `leader_port_name` is
    set for a leader: the agent exports its own address and that port as ARRANGER_LEADER_*.
    `owner` is the job's owner (with runAs: owner, the local account the pod runs as);
    `package` the job's working directory to unpack (None: none); `pids` the pod's pids
    limit (0: the agent's default); `grace_s` a kill's SIGTERM-to-SIGKILL time.
    """

    uid: str
    attempt: int
    job_id: str = ""
    job_name: str = ""
    pod_name: str = ""
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    working_dir: str = ""
    gpus: tuple[GpuGrant, ...] = ()
    ports: Mapping[str, int] = field(default_factory=dict)
    readiness_port: str = ""
    volumes: tuple[Volume, ...] = ()
    cpu_cores: float = 0.0
    memory_bytes: int = 0
    image: str = ""
    grace_s: float = 0.0
    leader_port_name: str = ""
    owner: str = ""
    package: Package | None = None
    pids: int = 0


@dataclass(frozen=True)
class KillOrder:
    """KillOrder: stop attempt `attempt` of pod `uid` (SIGTERM, SIGKILL after grace_s);
    `remove_scratch`: its scratch directory goes too once it has ended."""

    uid: str
    attempt: int
    grace_s: float = 0.0
    remove_scratch: bool = False
