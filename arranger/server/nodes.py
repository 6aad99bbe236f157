"""nodes holds what agents tell the server, already converted from the wire."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from arranger.server.model import GpuRecord, GpuSharing
from arranger.states import PodState


@dataclass(frozen=True)
class PodReport:
    """PodReport is an agent's word on one attempt of one pod."""

    pod_uid: str
    attempt: int
    state: PodState
    pid: int = 0
    exit_code: int | None = None
    reason: str = ""
    ports: Mapping[str, int] = field(default_factory=dict)
    start_time: float | None = None
    finish_time: float | None = None


@dataclass(frozen=True)
class NodeRegistration:
    """NodeRegistration is an agent's first message: what the node has and what it still runs."""

    name: str
    address: str
    cpu_milli: int
    memory_bytes: int
    gpus: tuple[GpuRecord, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    pods: tuple[PodReport, ...] = ()
    agent_version: str = ""
    runtimes: tuple[str, ...] = ()
    gpu_sharing: GpuSharing | None = None  # None: an agent that does not say
    agent_id: str = ""  # the agent's own id ("": an agent of an older release)
    kept_jobs: tuple[str, ...] = ()  # jobs the agent keeps directories of
    sent_at: float = 0.0  # the agent's clock when it sent this (0: an older agent)
