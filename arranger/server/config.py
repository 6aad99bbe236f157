"""config is arranger-server's configuration: defaults, overridden by a YAML file.

Example /etc/arranger/server.yaml (every key optional):

    listen: 0.0.0.0:50051
    dataDir: /var/lib/arranger
    store: postgresql://arranger@db-host/arranger   # default: sqlite://<dataDir>/arranger.db
    advertise: head-a:50051           # where clients reach this server (a standby names it);
                                      # default this host's name and the listen port
    leaseSeconds: 10                  # a shared store's lease: a standby takes over within it
    apiAddresses: [head-a:50051, head-b:50051]   # every server sharing the store, as clients
                                      # reach them: pods get them in ARRANGER_API, so a job's
                                      # own calls follow a failover; default `advertise`
    schedulePeriodSeconds: 1
    minCycleIntervalSeconds: 0.05     # under a flood of changes, cycles begin at most this often
    nodeTimeoutSeconds: 330
    fenceTimeoutSeconds: 300
    heartbeatIntervalSeconds: 5       # the shortest heartbeat period (see heartbeats)
    maxHeartbeatsPerSecond: 100       # from all agents together: the period stretches to keep it
    killGraceSeconds: 10
    maxPreemptionGraceSeconds: 300    # the most a job's preemptionGraceSeconds may ask
    maxEvictionNoticeSeconds: 300     # the most a job's evictionNoticeSeconds may ask
    restartBackoffSeconds: {initial: 1, max: 60}
    transientRetryLimit: 5             # restarts for a spec's retryOnExitCodes, per leader and per
                                      # worker set, that spend no restartLimit (at least 0)
    idleGpuMinutes: 0                 # a pod whose GPUs read under idleGpuUtilization this long
    idleGpuUtilization: 5             # is marked idle (event GpuIdle); 0: not watched
    schedulerConfig: scheduler.yaml   # actions, plugin tiers, score weights (see SchedulerConfig);
                                      # a relative path is read next to this file
    tls: {ca: ca.pem, cert: server.pem, key: server.key}   # from `arranger certs`; relative
                                      # paths are read next to this file
    agentListen: 0.0.0.0:50052        # with tls: where agents connect (mutual TLS); default
                                      # listen's port + 1
    insecure: false                   # true: serve without TLS and tokens (anyone who reaches
                                      # the port may run processes on every node); listens on
                                      # 127.0.0.1 unless `listen` says otherwise
    allowedHostPaths: [/data, /scratch]   # prefixes volumes' hostPath may lie under; default
                                      # none (no host paths)
    deniedEnv: [LD_PRELOAD, LD_AUDIT, GCONV_PATH, BASH_ENV, ENV, IFS]   # variables a job may not
                                      # set (this list is the default)
    httpListen: 127.0.0.1:50080       # Prometheus metrics at /metrics; "": off
    jobRetentionDays: 30              # finished jobs, their pods, events and logs are pruned
    historyRetentionDays: 365         # `arranger history` records are kept this long
    limits:                           # per user (README, "Security"); these are the defaults
      jobsPerUser: 1000               # unfinished jobs
      podsPerUser: 10000              # pods of unfinished jobs
      submitsPerSecond: 20            # admins are not rate limited
      submitBurst: 100
      specBytes: 1048576              # one job's whole spec
      streamsPerUser: 64              # open watch and log streams
      packageBytes: 104857600         # one job's packed working directory (--working-dir)
      storedPackageBytesPerUser: 4294967296   # the packages one user keeps in the store
      pidsPerPod: 65536               # the most one pod's resources.pids may ask (more: the
                                      # spec is refused, INVALID_ARGUMENT)
      jobBytesPerUser: 67108864       # the jobs a user keeps in the store, finished ones too
      eventsPerJob: 1000              # events stored of one job (its end is stored past it)
      listsPerSecond: 20              # pages of events and history read; admins are not
      listBurst: 100                  # rate limited

arranger-server refuses to start with neither `tls` nor `insecure: true`.
"""

from __future__ import annotations

import dataclasses
import math
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arranger.http_endpoint import EndpointError, split_listen
from arranger.sched import SchedulerConfig, SchedulerConfigError
from arranger.security import SecurityError, TlsFiles
from arranger.server.access import SubmitPolicy
from arranger.server.controller_config import ControllerConfig
from arranger.server.limits import UserLimits
from arranger.server.store import check_url, sqlite_url
from arranger.settings import read_settings

FENCE_MARGIN_S = 6.0
INSECURE_LISTEN = (
    "127.0.0.1:50051"  # the agent's check interval (0.5 s) and its fenced pods' grace (5 s)
)


class ConfigError(ValueError):
    """ConfigError names the file and key that could not be used."""


@dataclass(frozen=True)
class ServerConfig:
    """ServerConfig: timings in seconds. fence_timeout_s must stay below node_timeout_s so that
    a cut-off agent has stopped its pods before the server replaces them (0 disables fencing).
    The defaults (300 s and 330 s, like Slurm's SlurmdTimeout and Kubernetes' eviction delay)
    let a head node reboot, or the server be down for minutes, without stopping any pod."""

    listen: str = "0.0.0.0:50051"
    data_dir: Path = Path("/var/lib/arranger")
    store: str = ""  # the store's URL ("": the SQLite file arranger.db in data_dir)
    advertise: str = ""  # where clients reach this server ("": this host, the listen port)
    lease_s: float = 10.0  # the term of a shared store's lease (see leadership)
    api_addresses: tuple[str, ...] = ()  # every server's, as pods reach them (): advertised
    schedule_period_s: float = 1.0
    schedule_debounce_s: float = 0.002
    min_cycle_interval_s: float = 0.05
    heartbeat_interval_s: float = 5.0
    max_heartbeats_per_second: float = 100.0
    fence_timeout_s: float = 300.0
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    max_message_bytes: int = 4 * 2**20
    tls: TlsFiles | None = None  # None: no TLS, and no tokens unless agent_secret is set
    # Without TLS, a secret the agents show on every call; when set, every other caller needs a
    # token too, so that a server on 127.0.0.1 serves only who can read its owner's files
    # (arranger dev, on a machine other accounts share). "": every caller is the local admin.
    agent_secret: str = ""
    agent_listen: str = ""  # with tls, the agents' port (mutual TLS); default the next port
    http_listen: str = "127.0.0.1:50080"  # /metrics ("": off)
    init: bool = False  # create the store if there is none (arranger-server --init)
    migrate: bool = False  # migrate an older PostgreSQL store (arranger-server --migrate)
    job_retention_s: float = 30 * 86_400.0  # finished jobs, their pods, events and logs
    history_retention_s: float = 365 * 86_400.0  # history records
    idle_gpu_s: float = 0.0  # a pod's GPUs read idle this long are marked (idle_gpus); 0: off
    idle_gpu_utilization: float = 5.0  # percent: under it, a GPU reads idle
    policy: SubmitPolicy = field(default_factory=SubmitPolicy)
    limits: UserLimits = field(default_factory=UserLimits)

    @property
    def needs_tokens(self) -> bool:
        """needs_tokens: whether every user's call must carry a token (TLS, or a dev server's
        agent secret)."""
        return self.tls is not None or bool(self.agent_secret)

    @property
    def loopback(self) -> bool:
        """loopback: whether the API listens on this machine's loopback only."""
        host = self.listen.rpartition(":")[0].strip("[]")
        return host in ("localhost", "::1") or host.startswith("127.")

    @property
    def agent_listen_address(self) -> str:
        """agent_listen_address: agent_listen, or listen's host with the next port (port 0:
        any free port)."""
        if self.agent_listen:
            return self.agent_listen
        host, _, port = self.listen.rpartition(":")
        return f"{host}:{int(port) + 1 if int(port) else 0}"

    def api_for_pods(self, port: int) -> str:
        """api_for_pods: where a job's pods reach the API (ARRANGER_API), comma-separated:
        `apiAddresses`, else this server's advertised address."""
        return ",".join(self.api_addresses) or self.advertised(port)

    def advertised(self, port: int) -> str:
        """advertised: where clients and agents reach this server, listening on `port`:
        `advertise`, else the listen host (this host's name for a wildcard) and the port."""
        if self.advertise:
            return self.advertise
        host = self.listen.rpartition(":")[0]
        if host in ("", "0.0.0.0", "[::]", "::"):
            host = socket.gethostname()
        return f"{host}:{port}"

    @property
    def store_url(self) -> str:
        """store_url: where the store is (see arranger.server.store)."""
        return self.store or sqlite_url(self.data_dir / "arranger.db")

    def check(self) -> None:
        """check: a cut-off agent must have stopped its pods before the server gives up on its
        node. It stops them fenceTimeout after it last heard the server (which answers every
        heartbeat), taking up to FENCE_MARGIN_S more to end them; the server gives up
        nodeTimeout after the last heartbeat it heard. These are the configured values, for a
        small cluster; heartbeats stretches all three as it grows, keeping that order."""
        problem = check_url(self.store_url)
        if problem:
            raise ConfigError(problem)
        if self.http_listen:
            try:
                split_listen(self.http_listen, "httpListen")
            except EndpointError as exc:
                raise ConfigError(str(exc)) from exc
        for key, most in (
            ("maxPreemptionGraceSeconds", self.controller.max_preemption_grace_s),
            ("maxEvictionNoticeSeconds", self.controller.max_eviction_notice_s),
        ):
            if not (math.isfinite(most) and most >= 0):
                raise ConfigError(f"{key} ({most:g}) must be a number of seconds, 0 or more")
        if not (self.lease_s >= 1 and math.isfinite(self.lease_s)):
            raise ConfigError(f"leaseSeconds ({self.lease_s:g}) must be at least 1")
        interval = self.min_cycle_interval_s
        if not 0 <= interval <= self.schedule_period_s:
            raise ConfigError(
                f"minCycleIntervalSeconds ({interval:g}) must be between 0 and "
                f"schedulePeriodSeconds ({self.schedule_period_s:g})"
            )
        rate = self.max_heartbeats_per_second
        if not (rate > 0 and math.isfinite(rate)):
            raise ConfigError(f"maxHeartbeatsPerSecond ({rate:g}) must be a number above 0")
        node_timeout = self.controller.node_timeout_s
        needed = self.fence_timeout_s + self.heartbeat_interval_s + FENCE_MARGIN_S
        if self.fence_timeout_s and needed >= node_timeout:
            raise ConfigError(
                f"nodeTimeoutSeconds ({node_timeout:g}) must exceed fenceTimeoutSeconds + "
                f"heartbeatIntervalSeconds + {FENCE_MARGIN_S:g} ({needed:g}), or set "
                "fenceTimeoutSeconds to 0 to disable fencing"
            )
        if self.heartbeat_interval_s * 2 > node_timeout:
            raise ConfigError("heartbeatIntervalSeconds must be at most half of nodeTimeoutSeconds")


def load_server_config(path: Path | None, insecure: bool = False, **overrides: Any) -> ServerConfig:
    """load_server_config reads the YAML file (if any), then applies keyword overrides.
    Without `tls` it needs `insecure: true` in the file, or `insecure`."""
    raw = read_settings(path, ConfigError)
    try:
        config = _from_mapping(raw)
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError(f"{path or 'config'}: {exc}") from exc
    if "schedulerConfig" in raw:
        file = Path(str(raw["schedulerConfig"]))
        if path is not None and not file.is_absolute():
            file = path.parent / file
        config = dataclasses.replace(config, scheduler=load_scheduler_config(file))
    if "tls" in raw:
        try:
            tls = TlsFiles.from_mapping(
                raw["tls"], path.parent if path else None, ("ca", "cert", "key")
            )
        except SecurityError as exc:
            raise ConfigError(f"{path}: {exc}") from exc
        config = dataclasses.replace(config, tls=tls)
    elif raw.get("insecure") is True or insecure:
        if "listen" not in raw and "listen" not in overrides:
            config = dataclasses.replace(config, listen=INSECURE_LISTEN)
    else:
        raise ConfigError(
            f"{path or 'the server config'}: set tls (make the files with `arranger certs`), or "
            "insecure: true (--insecure) to serve without TLS and tokens (anyone who reaches the "
            "port could run processes on every node)"
        )
    config = dataclasses.replace(config, **overrides)
    config.check()
    return config


_KEYS = {
    "listen",
    "dataDir",
    "store",
    "advertise",
    "apiAddresses",
    "leaseSeconds",
    "schedulePeriodSeconds",
    "minCycleIntervalSeconds",
    "nodeTimeoutSeconds",
    "fenceTimeoutSeconds",
    "heartbeatIntervalSeconds",
    "maxHeartbeatsPerSecond",
    "killGraceSeconds",
    "restartBackoffSeconds",
    "transientRetryLimit",
    "schedulerConfig",
    "maxMessageBytes",
    "maxPreemptionGraceSeconds",
    "maxEvictionNoticeSeconds",
    "tls",
    "insecure",
    "agentListen",
    "allowedHostPaths",
    "deniedEnv",
    "limits",
    "jobRetentionDays",
    "idleGpuMinutes",
    "idleGpuUtilization",
    "historyRetentionDays",
    "httpListen",
}


def _from_mapping(raw: dict[str, Any]) -> ServerConfig:
    unknown = set(raw) - _KEYS
    if unknown:
        raise KeyError(f"unknown settings: {', '.join(sorted(unknown))}")
    base = ServerConfig()
    backoff = raw.get("restartBackoffSeconds", {})
    controller = ControllerConfig(
        backoff_initial_s=float(backoff.get("initial", base.controller.backoff_initial_s)),
        backoff_max_s=float(backoff.get("max", base.controller.backoff_max_s)),
        kill_grace_s=_number(raw, "killGraceSeconds", base.controller.kill_grace_s),
        node_timeout_s=_number(raw, "nodeTimeoutSeconds", base.controller.node_timeout_s),
        max_preemption_grace_s=_number(
            raw, "maxPreemptionGraceSeconds", base.controller.max_preemption_grace_s
        ),
        max_eviction_notice_s=_number(
            raw, "maxEvictionNoticeSeconds", base.controller.max_eviction_notice_s
        ),
        transient_retry_limit=_count(
            raw, "transientRetryLimit", base.controller.transient_retry_limit
        ),
    )
    policy = SubmitPolicy(
        allowed_host_paths=_paths(raw.get("allowedHostPaths", [])),
        denied_env=tuple(str(v) for v in raw.get("deniedEnv", base.policy.denied_env)),
    )
    return ServerConfig(
        job_retention_s=_days(raw, "jobRetentionDays", base.job_retention_s),
        history_retention_s=_days(raw, "historyRetentionDays", base.history_retention_s),
        idle_gpu_s=60 * _count(raw, "idleGpuMinutes", 0),
        idle_gpu_utilization=_percent(raw, "idleGpuUtilization", base.idle_gpu_utilization),
        policy=policy,
        limits=UserLimits.from_mapping(raw.get("limits", {})),
        listen=str(raw.get("listen", base.listen)),
        data_dir=Path(raw.get("dataDir", base.data_dir)),
        store=str(raw.get("store", base.store)),
        advertise=str(raw.get("advertise", base.advertise)),
        api_addresses=_addresses(raw.get("apiAddresses", [])),
        lease_s=_rate(raw, "leaseSeconds", base.lease_s),
        schedule_period_s=_number(raw, "schedulePeriodSeconds", base.schedule_period_s),
        min_cycle_interval_s=_number(raw, "minCycleIntervalSeconds", base.min_cycle_interval_s),
        heartbeat_interval_s=_number(raw, "heartbeatIntervalSeconds", base.heartbeat_interval_s),
        max_heartbeats_per_second=_rate(
            raw, "maxHeartbeatsPerSecond", base.max_heartbeats_per_second
        ),
        fence_timeout_s=_number(raw, "fenceTimeoutSeconds", base.fence_timeout_s),
        controller=controller,
        max_message_bytes=int(raw.get("maxMessageBytes", base.max_message_bytes)),
        agent_listen=str(raw.get("agentListen", base.agent_listen)),
        http_listen=str(raw.get("httpListen", base.http_listen)),
    )


def _days(raw: dict[str, Any], key: str, default_s: float) -> float:
    """_days: a retention in days, as seconds."""
    if key not in raw:
        return default_s
    days = float(raw[key])
    if not days > 0:
        raise ValueError(f"{key}: must be above 0 days")
    return days * 86_400.0


def _number(raw: dict[str, Any], key: str, default: float) -> float:
    """_number: the setting as a number; a value that is none names its key."""
    value = raw.get(key, default)
    if isinstance(value, bool):
        raise ValueError(f"{key}: {value!r} is not a number")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key}: {value!r} is not a number") from None


def _percent(raw: dict[str, Any], key: str, default: float) -> float:
    """_percent: the setting as a percentage, 0..100."""
    value = _number(raw, key, default)
    if not 0 <= value <= 100:
        raise ValueError(f"{key}: {value!r} is not a percentage (0..100)")
    return value


def _count(raw: dict[str, Any], key: str, default: int) -> int:
    """_count: the setting as a whole number of at least 0; another value names its key."""
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key}: {value!r} is not a whole number of at least 0")
    return value


def _rate(raw: dict[str, Any], key: str, default: float) -> float:
    """_rate: a number of events a second, above 0."""
    value = raw.get(key, default)
    try:
        rate = float(value)
    except (TypeError, ValueError):
        rate = math.nan
    if isinstance(value, bool) or not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"{key}: {value!r} is not a number above 0")
    return rate


def _addresses(raw: object) -> tuple[str, ...]:
    """_addresses: host:port addresses, a list or one comma-separated string."""
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, list):
        raise ValueError("apiAddresses: must be a list of host:port addresses")
    found = tuple(str(a).strip() for a in items if str(a).strip())
    for address in found:
        host, _, port = address.rpartition(":")
        well_formed = host and not any(c.isspace() or c == "," for c in address)
        if not (well_formed and port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"apiAddresses: {address[:80]!r} is not a host:port address")
    return found


def _paths(raw: object) -> tuple[str, ...]:
    if not isinstance(raw, list):
        raise ValueError("allowedHostPaths: must be a list of absolute paths")
    paths = tuple(str(p) for p in raw)
    for p in paths:
        if not p.startswith("/"):
            raise ValueError(f"allowedHostPaths: {p!r} is not an absolute path")
    return paths


def load_scheduler_config(path: Path) -> SchedulerConfig:
    """load_scheduler_config reads the scheduler's YAML file (see SchedulerConfig.from_mapping)."""
    raw = read_settings(path, ConfigError)
    try:
        return SchedulerConfig.from_mapping(raw)
    except SchedulerConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
