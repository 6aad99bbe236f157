"""podman: the podman CLI as the agent uses it, and the `podman run` command line of a pod.

What a container gets (see run_argv; PodmanRuntime, in podman_runtime, runs it):
- the host's network, so ports and the leader's address work as for a process;
- the environment contract of DESIGN §6 and nothing of the agent's own environment, with its
  paths as the container sees them (volumes at their mountPath, the pod's scratch directory
  at /arranger/scratch; see environment);
- its GPUs: the NVIDIA device nodes of the pod's GPUs (or the CDI devices, where the NVIDIA
  Container Toolkit has written a CDI spec), and CUDA_VISIBLE_DEVICES naming them by UUID
  where the agent knows their UUIDs (a container sees only its own devices, so indexes of
  the host would not match);
- its pids limit (`--pids-limit`: what the pod asked, else the agent's pidsLimit), and its
  request's memory limit and CPU quota (`--memory`, `--cpus`), where the agent holds pods
  to their requests. A quota below CPU_AT_START is set once the container runs (`podman
  update`): under it runc's own start takes seconds (2.6 s at 0.01 core, measured). An OOM
  kill is what podman says (`OOMKilled`) or what conmon noted in its working directory (an
  `oom` file: podman 4.3 with conmon 2.1 on cgroup v1 reports it only there);
- nothing of the job on podman's command line or in podman's environment: podman runs as
  root, so it gets an environment the agent builds (`podman_env`), and the pod's variables
  reach the container through a file only the agent can read (a value with a line break,
  which that file cannot hold, fails the pod);
- ulimits no higher than the agent's hard limits (podman's default of 1048576 open files fails
  where the agent may not raise its own), its stdout and stderr in the pod's log file
  (`--log-driver passthrough`), and an init process (`--init`) that passes signals on;
- its volumes only where their host paths lead without a symbolic link, and only where no
  mount point or working directory would be made on the host (see host_paths);
- the pod's account (its owner's, or the configured user) with its groups, no capability and
  no-new-privileges, so that a setuid program in the image cannot make it root again; never
  --privileged, never the host's PID or IPC namespace.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import resource
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arranger.agent import launcher, process
from arranger.agent.cgroups import DEFAULT_PIDS, pids_ceiling, pod_pids
from arranger.agent.launcher import ROOT_PATH, root_env
from arranger.agent.runtime import CONTAINER_SCRATCH, PodLaunch, StartError
from arranger.spec import image_problem

COMMAND_TIMEOUT_S = 60.0  # inspect, stop, rm; and `podman info`
CPU_AT_START = 0.1  # cores: a smaller quota is set once the container runs
NVIDIA_CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
CDI_SPECS = (Path("/etc/cdi/nvidia.yaml"), Path("/var/run/cdi/nvidia.yaml"))
INIT_PATHS = ("/usr/libexec/podman/catatonit", "/usr/bin/catatonit", "/usr/libexec/catatonit")
_NAME = re.compile(r"[^A-Za-z0-9_.-]")
# What of the agent's own environment podman gets: where its configuration and storage are
# (rootless podman in `arranger dev` needs them), and the proxies its pulls go through.
PODMAN_SETTINGS = (
    "HOME",
    "USER",
    "LOGNAME",
    "XDG_RUNTIME_DIR",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "TMPDIR",
    "CONTAINERS_CONF",
    "CONTAINERS_STORAGE_CONF",
    "CONTAINERS_REGISTRIES_CONF",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
)


@dataclass(frozen=True)
class Podman:
    """Podman: how to call the podman CLI on this machine."""

    binary: str
    version: str
    oci_runtime: str  # runc, where installed: crun fails on hosts with hybrid cgroups
    init: bool  # podman's init (catatonit) is installed

    @property
    def base(self) -> list[str]:
        runtime = ["--runtime", self.oci_runtime] if self.oci_runtime == "runc" else []
        return [self.binary, *runtime, "--cgroup-manager", "cgroupfs", "--events-backend", "file"]


@functools.cache
def find_podman(binary: str = "podman") -> tuple[Podman | None, str]:
    """find_podman: podman, if it is installed and answers `podman info`, else None and why.
    Asked once per process (it takes a third of a second)."""
    path = binary if os.sep in binary else launcher.which(binary)
    if path is None:
        return None, f"{binary} is not installed in {ROOT_PATH}"
    runtime = "runc" if launcher.which("runc") else ""
    probe = Podman(os.path.abspath(path), "", runtime, False)
    try:
        done = subprocess.run(
            [*probe.base, "info", "--format", "json"],
            env=podman_env(),
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"podman info failed: {exc}"
    if done.returncode != 0:
        return None, f"podman info failed: {last_line(done.stderr)}"
    try:
        info = json.loads(done.stdout)
        version = str(info["version"]["Version"])
        runtime = runtime or str(info["host"]["ociRuntime"]["name"])
    except (ValueError, KeyError, TypeError) as exc:
        return None, f"podman info said something unexpected: {exc}"
    return Podman(probe.binary, version, runtime, any(os.path.exists(p) for p in INIT_PATHS)), ""


def podman_env() -> dict[str, str]:
    """podman_env: podman's whole environment: the root PATH (where podman finds conmon, runc
    and their helpers) and the agent's own settings podman reads, never a job's."""
    return root_env(**{k: v for k in PODMAN_SETTINGS if (v := os.environ.get(k)) is not None})


def ulimits() -> list[str]:
    """ulimits: podman's --ulimit flags for open files and processes, as high as the agent's own
    hard limits and no higher. Processes are held below the kernel's pid_max as a plain
    process's are (cgroups.pids_ceiling: the kernel counts them over all of a user's
    processes); podman keeps its own process limit at most pid_max anyway (it measured 32768
    where the agent's hard limit was 96365)."""
    flags = []
    for name, which, ceiling in (
        ("nofile", resource.RLIMIT_NOFILE, _read_int("/proc/sys/fs/nr_open")),
        ("nproc", resource.RLIMIT_NPROC, pids_ceiling()),
    ):
        hard = resource.getrlimit(which)[1]
        if hard == resource.RLIM_INFINITY or (ceiling and hard > ceiling):
            hard = ceiling or 1 << 20
        flags += ["--ulimit", f"{name}={hard}:{hard}"]
    return flags


def container_name(node: str, key: str) -> str:
    """container_name: the name of a pod attempt's container on this node (`key` is
    `<job id>/<pod>.<attempt>`)."""
    return "arranger-" + _NAME.sub("_", f"{node}-{key.replace('/', '-')}")


@dataclass(frozen=True)
class Containers:
    """Containers: how this node runs containers: podman, the node's name (in each
    container's name and labels), whether pods are held to their requests (`limits`), the
    pull policy, a pod's pids limit unless it asks another (0: podman's own), and where the
    device nodes are (`dev`)."""

    podman: Podman
    node_name: str
    limits: bool = True
    pull: str = "missing"
    pids: int = DEFAULT_PIDS
    dev: Path = Path("/dev")


def run_argv(
    settings: Containers, launch: PodLaunch, env_file: Path, conmon_pidfile: Path | None = None
) -> list[str]:
    """run_argv: the `podman run` command that starts the pod's container. The variables
    go in `env_file` (written here, readable by the agent only), not in the command line
    anyone may read, nor in podman's own environment, where a job could reach podman's
    settings; a value with a line break, which that file cannot hold, fails the pod."""
    order = launch.order
    problem = image_problem(order.image)
    if problem:
        raise StartError(125, f"ContainerError: image {order.image!r} {problem}")
    name = container_name(settings.node_name, launch.key)
    uid, _, attempt = launch.key.rpartition(".")
    argv = [
        *settings.podman.base,
        "run",
        "--detach",
        "--name",
        name,
        *([f"--conmon-pidfile={conmon_pidfile}"] if conmon_pidfile else []),
        "--label",
        f"arranger.node={settings.node_name}",
        "--label",
        f"arranger.pod={uid}",
        "--label",
        f"arranger.attempt={attempt}",
        "--network",
        "host",
        "--log-driver",
        "passthrough",
        f"--pull={settings.pull}",
        *ulimits(),
        "--volume",
        f"{launch.scratch}:{CONTAINER_SCRATCH}",
    ]
    if settings.podman.init:
        argv.append("--init")
    pids = pod_pids(order.pids, settings.pids, pids_ceiling())
    if pids:
        argv.append(f"--pids-limit={pids}")
    if settings.limits and order.memory_bytes:
        argv += [f"--memory={order.memory_bytes}", f"--memory-swap={order.memory_bytes}"]
    if settings.limits and order.cpu_cores >= CPU_AT_START:
        argv.append(f"--cpus={order.cpu_cores:g}")
    user = launch.user
    if user is not None:  # with no capability, and no setuid program to make it root again
        argv += [
            "--user",
            f"{user.uid}:{user.gid}",
            "--security-opt",
            "no-new-privileges",
            "--cap-drop=all",
        ]
        argv += [f"--group-add={gid}" for gid in user.groups if gid != user.gid]
    if launch.cwd is not None:
        argv += ["--workdir", str(launch.cwd)]
    for volume in order.volumes:
        if any(c in volume.host_path for c in ":,"):
            raise StartError(
                125,
                f"ContainerError: volume {volume.name}: podman cannot mount a "
                f"hostPath with ':' or ',' ({volume.host_path})",
            )
        mode = ":ro" if volume.read_only else ""
        argv += ["--volume", f"{volume.host_path}:{volume.mount_path}{mode}"]
    gpus = [g.index for g in order.gpus]
    if gpus:  # the container sees its own devices only (see environment on how it names them)
        argv += _devices(gpus, settings.dev)
    env = launch.env
    for key, value in env.items():
        if any(c in f"{key}{value}" for c in "\n\r\0"):
            raise StartError(
                125,
                f"ContainerError: env {key.splitlines()[0]!r} holds a line break or "
                "NUL, which podman cannot pass to a container",
            )
    with os.fdopen(process.open_private(env_file), "w") as f:
        f.writelines(f"{k}={v}\n" for k, v in env.items())
    argv += ["--env-file", str(env_file)]
    # Kubernetes' reading: command replaces the image's entrypoint, args its command.
    argv += ["--entrypoint", json.dumps(list(order.command)), order.image, *order.args]
    return argv


def _devices(gpus: Sequence[int], dev: Path) -> list[str]:
    """_devices: the --device flags of the GPUs `gpus`: CDI devices where the NVIDIA
    Container Toolkit wrote a CDI spec, else their device nodes under `dev` and the control
    devices there."""
    if any(spec.exists() for spec in CDI_SPECS):
        return [f"--device=nvidia.com/gpu={i}" for i in gpus]
    nodes = [f"nvidia{i}" for i in gpus] + list(NVIDIA_CONTROL_DEVICES)
    return [f"--device={dev / n}" for n in nodes if (dev / n).exists()]


def inspect_now(podman: Podman, name: str) -> dict[str, Any] | None:
    return _state(podman_now(podman, "container", "inspect", "--format", "{{json .State}}", name))


def podman_now(podman: Podman, *args: str) -> str | None:
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        done = subprocess.run(
            [*podman.base, *args],
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
            env=podman_env(),
        )
        if done.returncode == 0:
            return done.stdout
    return None


def _state(said: str | None) -> dict[str, Any] | None:
    if not said:
        return None
    with contextlib.suppress(ValueError):
        state = json.loads(said)
        if isinstance(state, dict):
            return state
    return None


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _read_int(path: str) -> int:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return 0
