"""config is arranger-agent's configuration: defaults, overridden by a YAML file and flags.

Example /etc/arranger/agent.yaml (every key optional):

    server: head-node:50051      # or several sharing one store: head-a:50052,head-b:50052
    nodeName: gpu-07            # default: the host name
    address: 10.0.0.7           # how other machines reach pods here; default: found by routing
    dataDir: /var/lib/arranger-agent
    labels: {zone: a}
    reserve: {cpu: 1, memory: 4Gi}   # kept back for the system
    capacity: {cpu: 50, memory: 64Gi}  # report these instead of the cores and memory found
                                # (a logical size, as Slurm's CPUs=; either key alone is fine)
    fakeGpus: {count: 0, model: FakeGPU}
    gpuSharing: mps             # hold each pod given a share of a GPU to it with an NVIDIA MPS
                                # daemon of its own, started by the agent (see agent/shares);
                                # default none: shares are promised only. `mps: true` is an
                                # older way to say it, still taken
    mpsControl: nvidia-cuda-mps-control   # the MPS control program (default: found on PATH)
    tls: {ca: ca.pem, cert: gpu-07.pem, key: gpu-07.key}   # from `arranger certs`: trust only
                                # the server this CA signed, and prove who we are to it
    runAs: owner                # each pod runs as the local account named by its job's owner
                                # (looked up at launch, as Slurm does: the same name on every
                                # machine); a pod whose owner has no account here fails with
                                # NoSuchUser. Needs the agent to run as root. Exclusive with:
    user: arranger-jobs         # every pod runs as this one account (root needed to switch)
                                # neither: pods run as the agent's own user (arranger dev)
    runAsRoot: false            # an agent running as root refuses to run pods as root unless true
                                # (a job owned by root, with runAs: owner, included)
    limits: true                # hold each pod to its memory and CPU request in a cgroup
                                # (pids limits and the GPU device filter hold either way,
                                # where the agent runs as root)
    pidsLimit: 4096             # each pod's processes and threads at once, unless its
                                # resources.pids asks another (0: none but the machine's)
    podman: true                # run pods that name an image with podman, where it works;
                                # false: never; or the podman binary's path
    imagePull: missing          # podman's pull policy: missing, always, never or newer
    maxLogBytes: 1Gi            # each pod attempt's log keeps its newest this many bytes; the
                                # older output is dropped as the pod runs (0: keep all)
    httpListen: 127.0.0.1:50090 # Prometheus metrics at /metrics; default: none served
    allowedHostPaths: [/data]   # a volume's hostPath must lie under one of these here too,
                                # whatever the server allowed; default: the server's check alone
    usageIntervalSeconds: 5     # each running pod's CPU, memory and GPU use is sampled this
                                # often (or each heartbeat period, if longer) and sent to the
                                # server (0: never)
    stopPodsOnExit: false       # false: SIGTERM/SIGINT stop the agent alone, its pods run on and
                                # the next agent (same or newer) adopts them; true: the agent
                                # stops its pods as it exits (they run again elsewhere, or here
                                # when it returns, without counting a restart)
"""

from __future__ import annotations

import os
import pwd
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arranger.agent.cgroups import DEFAULT_PIDS
from arranger.agent.launcher import LaunchError, find_tools, which
from arranger.http_endpoint import EndpointError, split_listen
from arranger.quantity import QuantityError, parse_cpu, parse_memory
from arranger.security import SecurityError, TlsFiles
from arranger.settings import read_settings

PULL_POLICIES = ("missing", "always", "never", "newer")
GPU_SHARING = ("mps", "none")


class AgentConfigError(ValueError):
    """AgentConfigError names the file and setting that could not be used."""


@dataclass(frozen=True)
class AgentConfig:
    """AgentConfig: `share` divides this machine's CPU and memory (dev runs N agents on one
    machine, each reporting 1/N); `reserve_*` is subtracted for the system first."""

    server: str = "127.0.0.1:50051"
    node_name: str = field(default_factory=socket.gethostname)
    address: str = ""
    data_dir: Path = Path("/var/lib/arranger-agent")
    labels: dict[str, str] = field(default_factory=dict)
    reserve_cpu_milli: int = 0
    reserve_memory_bytes: int = 0
    capacity_cpu_milli: int = 0  # declared cores (0: the ones found), before share and reserve
    capacity_memory_bytes: int = 0  # declared memory (0: the memory found)
    share: int = 1
    fake_gpus: int = 0
    fake_gpu_model: str = "FakeGPU"
    path_prepend: tuple[str, ...] = ()
    fence_timeout_s: float = 300.0  # until a server says (and then as it last said)
    heartbeat_interval_s: float = 5.0
    reconnect_max_s: float = 10.0
    resync_interval_s: float = 30.0
    stop_pods_on_exit: bool = False  # stop every pod when the agent exits (SIGTERM, SIGINT)
    gpu_sharing: str = ""  # "mps": pods' GPU shares are held by MPS daemons ("": promised only)
    mps_control: str = "nvidia-cuda-mps-control"  # a name looked up on PATH, or a path
    tls: TlsFiles | None = None  # the CA to trust and this agent's certificate (arranger certs)
    secret: str = ""  # without TLS: shown on every call to a server that asks (arranger dev)
    # Prefixes a volume's hostPath must lie under on this node, checked again by the agent
    # (None: the server's allowedHostPaths alone).
    allowed_host_paths: tuple[str, ...] | None = None
    user: str = ""  # pods run as this user ("": as the agent, or as their owner)
    run_as: str = ""  # "owner": each pod runs as its job owner's account
    run_as_root: bool = False  # an agent running as root may run pods as root only if this says so
    limits: bool = True  # hold pods to their requests in cgroups, where the host lets us
    pids_limit: int = DEFAULT_PIDS  # a pod's pids limit unless it asks another (0: none)
    podman: str = "podman"  # the podman binary for image pods ("": no containers here)
    image_pull: str = "missing"
    max_log_bytes: int = 2**30  # per pod attempt; 0: no limit
    http_listen: str = ""  # HOST:PORT of /metrics ("": none)
    usage_interval_s: float = 5.0  # how often each running pod's usage is sampled (0: never)

    @property
    def mps(self) -> bool:
        """mps: whether shares are held by MPS daemons (what `mps: true` said before)."""
        return self.gpu_sharing == "mps"


_KEYS = {
    "server",
    "nodeName",
    "address",
    "dataDir",
    "labels",
    "reserve",
    "capacity",
    "fakeGpus",
    "mps",
    "tls",
    "gpuSharing",
    "mpsControl",
    "user",
    "runAs",
    "runAsRoot",
    "limits",
    "pidsLimit",
    "podman",
    "imagePull",
    "maxLogBytes",
    "stopPodsOnExit",
    "httpListen",
    "usageIntervalSeconds",
    "allowedHostPaths",
}
RUN_AS = ("owner",)


def load_agent_config(path: Path | None, **overrides: Any) -> AgentConfig:
    """load_agent_config reads the YAML file (if any), then applies non-None keyword overrides."""
    raw = read_settings(path, AgentConfigError)
    unknown = set(raw) - _KEYS
    if unknown:
        raise AgentConfigError(f"{path}: unknown settings: {', '.join(sorted(unknown))}")
    values: dict[str, Any] = {}
    try:
        for key, name in (("server", "server"), ("nodeName", "node_name"), ("address", "address")):
            if key in raw:
                values[name] = str(raw[key])
        if "dataDir" in raw:
            values["data_dir"] = Path(raw["dataDir"])
        values.update(_gpu_sharing(raw))
        if "user" in raw:
            values["user"] = str(raw["user"])
        if "runAs" in raw:
            values["run_as"] = str(raw["runAs"] or "")
        if "runAsRoot" in raw:
            values["run_as_root"] = raw["runAsRoot"] is True
        if "stopPodsOnExit" in raw:
            values["stop_pods_on_exit"] = raw["stopPodsOnExit"] is True
        if "limits" in raw:
            values["limits"] = raw["limits"] is not False
        if "pidsLimit" in raw:
            values["pids_limit"] = _whole(raw["pidsLimit"], "pidsLimit")
        if "podman" in raw:
            podman = raw["podman"]
            values["podman"] = "podman" if podman is True else str(podman or "")
        if "httpListen" in raw:
            values["http_listen"] = str(raw["httpListen"] or "")
            if values["http_listen"]:
                split_listen(values["http_listen"], "httpListen")
        if "usageIntervalSeconds" in raw:
            values["usage_interval_s"] = float(raw["usageIntervalSeconds"])
            if not 0 <= values["usage_interval_s"] < 3_600:
                raise ValueError("usageIntervalSeconds: must be 0 (never) up to 3600")
        if "imagePull" in raw:
            values["image_pull"] = str(raw["imagePull"])
            if values["image_pull"] not in PULL_POLICIES:
                raise ValueError(f"imagePull: must be one of {', '.join(PULL_POLICIES)}")
        if "tls" in raw:
            base = path.parent if path else None
            values["tls"] = TlsFiles.from_mapping(raw["tls"], base, ("ca", "cert", "key"))
        if "allowedHostPaths" in raw:
            values["allowed_host_paths"] = _prefixes(raw["allowedHostPaths"])
        if "labels" in raw:
            labels = _mapping(raw["labels"], "labels", "{NAME: VALUE, ...}")
            values["labels"] = {str(k): str(v) for k, v in labels.items()}
        if "maxLogBytes" in raw:
            values["max_log_bytes"] = parse_memory(raw["maxLogBytes"])
        reserve = _mapping(raw.get("reserve") or {}, "reserve", "{cpu: N, memory: SIZE}")
        if "cpu" in reserve:
            values["reserve_cpu_milli"] = round(parse_cpu(reserve["cpu"]) * 1000)
        if "memory" in reserve:
            values["reserve_memory_bytes"] = parse_memory(reserve["memory"])
        values.update(_declared_capacity(raw.get("capacity")))
        fake = raw.get("fakeGpus") or {}
        if isinstance(fake, int) and not isinstance(fake, bool):  # fakeGpus: 2
            fake = {"count": fake}
        fake = _mapping(fake, "fakeGpus", "{count: N, model: NAME}, or a count")
        if "count" in fake:
            values["fake_gpus"] = _whole(fake["count"], "fakeGpus.count")
        if "model" in fake:
            values["fake_gpu_model"] = str(fake["model"])
    except (TypeError, ValueError, QuantityError, SecurityError, EndpointError) as exc:
        raise AgentConfigError(f"{path}: {exc}") from exc
    values.update({k: v for k, v in overrides.items() if v is not None})
    config = AgentConfig(**values)
    if config.run_as and config.run_as not in RUN_AS:
        raise AgentConfigError(
            f"{path}: runAs: must be {' or '.join(RUN_AS)}, not {config.run_as!r}"
        )
    if config.run_as and config.user:
        raise AgentConfigError(f"{path}: runAs and user exclude each other: say one")
    return config


def _gpu_sharing(raw: dict[str, Any]) -> dict[str, str]:
    """_gpu_sharing: gpuSharing (mps or none) and mpsControl; `mps: true` says gpuSharing: mps
    (`mps: false`, none), and may not contradict a gpuSharing given too."""
    values: dict[str, str] = {}
    if "gpuSharing" in raw:
        said = raw["gpuSharing"]
        sharing = "none" if said is False or said is None else str(said)
        if sharing not in GPU_SHARING:
            raise ValueError(f"gpuSharing: must be one of {', '.join(GPU_SHARING)}, not {said!r}")
        values["gpu_sharing"] = "" if sharing == "none" else sharing
    if "mps" in raw:
        alias = "mps" if raw["mps"] is True else ""
        if values.get("gpu_sharing", alias) != alias:
            raise ValueError("mps and gpuSharing say different things: say gpuSharing alone")
        values["gpu_sharing"] = alias
    if "mpsControl" in raw:
        values["mps_control"] = str(raw["mpsControl"] or "")
        if not values["mps_control"]:
            raise ValueError("mpsControl: must name the MPS control program")
    return values


def _prefixes(value: object) -> tuple[str, ...]:
    """_prefixes: allowedHostPaths, a list of normalised absolute paths."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"allowedHostPaths: must be a list of paths, not {value!r}")
    for path in value:
        if not path.startswith("/") or os.path.normpath(path) != path or path.startswith("//"):
            raise ValueError(f"allowedHostPaths: {path!r} is not a normalised absolute path")
    return tuple(value)


def _mapping(value: object, key: str, shape: str) -> dict[str, Any]:
    """_mapping: a setting that must be a mapping, said as `shape` when it is not."""
    if not isinstance(value, dict):
        raise ValueError(f"{key}: must be {shape}, not {value!r}")
    return value


def _whole(value: object, key: str) -> int:
    """_whole: a setting that must be a whole number, 0 or more."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key}: must be a whole number, 0 or more, not {value!r}")
    return value


def _declared_capacity(raw: object) -> dict[str, int]:
    """_declared_capacity: the `capacity` setting's cores (milli) and memory, each above 0."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not raw or set(raw) - {"cpu", "memory"}:
        raise ValueError("capacity: must be a mapping of cpu and/or memory")
    values = {}
    for key, name, parse in (
        ("cpu", "capacity_cpu_milli", lambda v: round(parse_cpu(v) * 1000)),
        ("memory", "capacity_memory_bytes", parse_memory),
    ):
        if key in raw:
            try:
                values[name] = int(parse(raw[key]))
            except QuantityError as exc:
                raise ValueError(f"capacity.{key}: {exc}") from None
            if values[name] <= 0:
                raise ValueError(f"capacity.{key}: must be above 0")
    return values


def route_address(server: str) -> str:
    """route_address: this machine's IP on the route to the server (no packet is sent)."""
    host, _, port = server.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, int(port or 50051)))
            return str(probe.getsockname()[0])
    except (OSError, ValueError):
        return "127.0.0.1"


@dataclass(frozen=True)
class PodUser:
    """PodUser: who the pods run as, when that is not the agent's own user."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    @classmethod
    def of(cls, entry: pwd.struct_passwd) -> PodUser:
        """of: the account a password entry names, with its supplementary groups."""
        groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir)


def check_pods_not_root(config: AgentConfig) -> None:
    """check_pods_not_root: arranger-agent running as root must say who its pods run as
    (runAs: owner, or user: NAME), or say runAsRoot (arranger dev runs pods as the developer
    and does not ask)."""
    if os.geteuid() == 0 and not config.user and not config.run_as and not config.run_as_root:
        raise AgentConfigError(
            "the agent runs as root, so its pods would too: set runAs: owner (or user: NAME) "
            "for them (or runAsRoot: true; flags --run-as, --user, --run-as-root)"
        )


def pod_user(config: AgentConfig) -> PodUser | None:
    """pod_user: the one user the config names for pods (None: the agent's own, or each pod's
    owner); only root can run pods as another user, and it needs setpriv and a Python every
    user may run for that."""
    root = os.geteuid() == 0
    if config.run_as == "owner":
        if not root:
            raise AgentConfigError("runAs: owner: only an agent running as root can switch users")
        _check_switching("runAs")
        return None
    if not config.user:
        return None
    try:
        entry = pwd.getpwnam(config.user)
    except KeyError:
        raise AgentConfigError(f"user: no user named {config.user!r} on this machine") from None
    if entry.pw_uid == os.geteuid():
        return None
    if not root:
        raise AgentConfigError(
            f"user: {config.user!r} is not the agent's own user, and only root may switch"
        )
    _check_switching("user")
    return PodUser.of(entry)


def _check_switching(setting: str) -> None:
    try:
        find_tools(switching=True)
    except LaunchError as exc:
        raise AgentConfigError(f"{setting}: {exc}") from None
    if which("setpriv") is None:
        raise AgentConfigError(
            f"{setting}: running pods as another user needs setpriv (util-linux)"
        )
