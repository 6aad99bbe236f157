"""podman runs pods whose template names an image in containers, with the podman CLI.

`podman run --detach` starts the container under conmon, podman's per-container monitor, which
outlives the agent; the agent watches conmon's pid as it watches a shim's, and asks podman how
the container ended (`inspect`) before it removes it. Containers are named and labelled after
the node and the pod attempt (`arranger.node`, `arranger.pod`, `arranger.attempt`), so an agent
started again finds its own by name.

What a container gets:
- the host's network, so ports and the leader's address work as for a process;
- the environment contract of DESIGN §6 and nothing of the agent's own environment, with its
  paths as the container sees them (volumes at their mountPath, the pod's scratch directory
  at /arranger/scratch);
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

Stopping is `podman stop` with the grace period (SIGTERM, then SIGKILL), then `podman rm`.
The pull policy is podman's `missing` unless configured; a missing image fails the pod with
podman's own message. A command the image cannot start fails it with ContainerCommandNotFound
or ContainerCannotRun (see start_failure).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import os
import re
import resource
import shutil
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from arranger.agent import host_paths, launcher, process, start_failure
from arranger.agent.batching import TurnBatch
from arranger.agent.cgroups import DEFAULT_PIDS, pids_ceiling, pod_pids
from arranger.agent.fence import FenceFiles
from arranger.agent.launcher import ROOT_PATH, root_env
from arranger.agent.runtime import (
    CONTAINER_SCRATCH,
    RUNNING,
    Ending,
    PodLaunch,
    Started,
    StartError,
)
from arranger.spec import image_problem

log = structlog.get_logger("arranger.agent")

START_TIMEOUT_S = 600.0  # a pull may take long, but not forever
MOUNT_CHECK_S = 30.0  # the walk of a container's host paths, at most
COMMAND_TIMEOUT_S = 60.0  # inspect, stop, rm
MAX_CALLS = 4  # podman commands at once
REMOVE = ("rm", "--force", "--ignore")  # a container, running or not, or already gone
CPU_AT_START = 0.1  # cores: a smaller quota is set once the container runs
NVIDIA_CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
CDI_SPECS = (Path("/etc/cdi/nvidia.yaml"), Path("/var/run/cdi/nvidia.yaml"))
INIT_PATHS = ("/usr/libexec/podman/catatonit", "/usr/bin/catatonit", "/usr/libexec/catatonit")
# Where podman mounts files of its own in every container (INIT_MOUNT: with --init), outside
# /dev, /proc and /sys, where no volume may go (host_paths).
PODMAN_MOUNTS = ("/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/run/.containerenv")
INIT_MOUNT = "/run/podman-init"
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
        return None, f"podman info failed: {_last_line(done.stderr)}"
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


@dataclass
class _Container:
    name: str
    conmon: int
    exit_file: Path
    ended: bool = False  # it ended before the agent could watch its conmon
    watch: subprocess.Popen[bytes] | None = None  # its fence watch (process.CONTAINER_WATCH)
    log_path: Path | None = None  # where its init says it could not exec `command`
    command: str = ""

    @property
    def workdir(self) -> Path:
        """workdir: conmon's working directory, where it notes an OOM kill."""
        return _workdir(self.exit_file)


class PodmanRuntime:
    """PodmanRuntime runs image pods in podman containers (see the module's doc)."""

    kind = "podman"

    def __init__(
        self,
        podman: Podman,
        node_name: str,
        limits: bool = True,
        gpu_uuids: Mapping[int, str] | None = None,
        pull: str = "missing",
        dev: Path = Path("/dev"),
        fence: FenceFiles | None = None,
        pids: int = DEFAULT_PIDS,
        allowed_host_paths: Sequence[str] | None = None,
    ) -> None:
        """`fence`: the agent's fence files; each container then gets a watch that stops it
        while no agent runs past the fence timeout, as a process's shim does; `pids`: a
        container's pids limit unless its pod asks another (0: podman's own);
        `allowed_host_paths`: the prefixes this node lets a volume mount (None: those the
        server allowed)."""
        self.pids = pids
        self.allowed_host_paths = allowed_host_paths
        self.podman = podman
        self.fence = fence
        self.node_name = node_name
        self.limits = limits
        self.gpu_uuids = dict(gpu_uuids or {})
        self.pull = pull
        self.dev = dev
        self.description = f"podman {podman.version} ({podman.oci_runtime or 'default runtime'})"
        self._containers: dict[str, _Container] = {}
        self._claimed: set[str] = set()  # containers named by run records, at recovery
        self._tasks: set[asyncio.Task[Any]] = set()
        self._calls = asyncio.Semaphore(MAX_CALLS)
        self._starts = asyncio.Semaphore(MAX_CALLS)
        self._starting: dict[str, asyncio.subprocess.Process] = {}  # `podman run`s under way
        self.inspections: TurnBatch[dict[str, Any]] = TurnBatch(self._inspect_many)
        self.removals: TurnBatch[None] = TurnBatch(self._podman_many(*REMOVE))
        self._stops: dict[int, TurnBatch[None]] = {}

    # The command line.

    def run_argv(
        self, launch: PodLaunch, env_file: Path, conmon_pidfile: Path | None = None
    ) -> list[str]:
        """run_argv: the `podman run` command that starts the pod's container. The variables
        go in `env_file` (written here, readable by the agent only), not in the command line
        anyone may read, nor in podman's own environment, where a job could reach podman's
        settings; a value with a line break, which that file cannot hold, fails the pod."""
        order = launch.order
        problem = image_problem(order.image)
        if problem:
            raise StartError(125, f"ContainerError: image {order.image!r} {problem}")
        name = container_name(self.node_name, launch.key)
        uid, _, attempt = launch.key.rpartition(".")
        argv = [
            *self.podman.base,
            "run",
            "--detach",
            "--name",
            name,
            *([f"--conmon-pidfile={conmon_pidfile}"] if conmon_pidfile else []),
            "--label",
            f"arranger.node={self.node_name}",
            "--label",
            f"arranger.pod={uid}",
            "--label",
            f"arranger.attempt={attempt}",
            "--network",
            "host",
            "--log-driver",
            "passthrough",
            f"--pull={self.pull}",
            *ulimits(),
            "--volume",
            f"{launch.scratch}:{CONTAINER_SCRATCH}",
        ]
        if self.podman.init:
            argv.append("--init")
        pids = pod_pids(order.pids, self.pids, pids_ceiling())
        if pids:
            argv.append(f"--pids-limit={pids}")
        if self.limits and order.memory:
            argv += [f"--memory={order.memory}", f"--memory-swap={order.memory}"]
        if self.limits and order.cpu >= CPU_AT_START:
            argv.append(f"--cpus={order.cpu:g}")
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
        env = dict(launch.env)
        gpus = [g.index for g in order.gpus]
        if gpus:  # the container sees its own devices only: by UUID, or numbered from 0
            argv += self._devices(gpus)
            if all(i in self.gpu_uuids for i in gpus):
                env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpu_uuids[i] for i in gpus)
            else:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(gpus)))
        # An NVIDIA hook, where installed, reads this; "void": no GPU, whatever the image says.
        env["NVIDIA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES") or "void"
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

    def _devices(self, gpus: Sequence[int]) -> list[str]:
        if any(spec.exists() for spec in CDI_SPECS):
            return [f"--device=nvidia.com/gpu={i}" for i in gpus]
        nodes = [f"nvidia{i}" for i in gpus] + list(NVIDIA_CONTROL_DEVICES)
        return [f"--device={self.dev / n}" for n in nodes if (self.dev / n).exists()]

    # Runtime.

    async def start(self, launch: PodLaunch) -> Started:
        order = launch.order
        name = container_name(self.node_name, launch.key)
        workdir = _workdir(launch.exit_file)
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(mode=0o700)
        pidfile = workdir / "conmon.pid"
        try:
            await self._run(launch, workdir)
            try:
                conmon = int(pidfile.read_text().strip() or 0)
            except (OSError, ValueError):
                conmon = 0
            if not conmon:
                raise StartError(125, f"ContainerError: podman lost container {name}")
            if self.limits and 0 < order.cpu < CPU_AT_START:
                await self._podman("update", f"--cpus={order.cpu:g}", name)
        except BaseException:
            await self.removals.call(name)
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        started = process.started_at(conmon)  # None: the container has ended already
        container = _Container(name, conmon, launch.exit_file, started is None)
        if self.podman.init:
            container.log_path, container.command = launch.log_path, _program(launch)
        if self.fence is not None and started is not None:
            container.watch = process.watch_container(
                self.fence, conmon, name, self.podman.base, launch.exit_file, launch.log_path
            )
        self._containers[launch.key] = container
        return Started(conmon, started or 0.0, {"container": name})

    async def _run(self, launch: PodLaunch, workdir: Path) -> None:
        """_run starts the container; podman's own messages land in the pod's log, and the
        last of them is the reason when it fails."""
        env_file = workdir / "env"
        argv = self.run_argv(launch, env_file, workdir / "conmon.pid")
        log = process.open_log(launch.log_path)
        log_fd = log.fileno()
        try:
            async with self._starts:  # apart from other calls: a pull must not hold up a stop
                # As late as can be (see host_paths on what is left), off the agent's loop: a
                # host path on a hung network mount must not stop its heartbeats.
                try:
                    async with asyncio.timeout(MOUNT_CHECK_S):
                        await asyncio.to_thread(self._check_mounts, launch)
                except TimeoutError:
                    raise StartError(
                        125,
                        f"ContainerError: the volumes' host paths did not answer within "
                        f"{MOUNT_CHECK_S:g} s",
                    ) from None
                offset = os.lseek(log_fd, 0, os.SEEK_END)
                # If the agent dies meanwhile, so does this podman run (setpriv's parent
                # death signal): the agent started again could not know its container.
                proc = await asyncio.create_subprocess_exec(
                    *_die_with_parent(),
                    *argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_fd,
                    stderr=log_fd,
                    start_new_session=True,
                    cwd=workdir,
                    env=podman_env(),
                )
                self._starting[launch.key] = proc
                try:
                    async with asyncio.timeout(START_TIMEOUT_S):
                        code = await proc.wait()
                except TimeoutError:
                    raise StartError(
                        125, f"StartTimeout: podman run did not finish in {START_TIMEOUT_S:g}s"
                    ) from None
                finally:
                    del self._starting[launch.key]
                    if proc.returncode is None:  # timed out or cancelled
                        proc.kill()
                        await proc.wait()
        finally:
            log.close()
            env_file.unlink(missing_ok=True)
        if code != 0:
            said = _last_line(_read_from(launch.log_path, offset))
            raise StartError(code, start_failure.podman_run(code, said, _program(launch)))

    def _check_mounts(self, launch: PodLaunch) -> None:
        """_check_mounts fails the pod (StartError) where its volumes' host paths, its mount
        points or its working directory would let podman and runc reach, as root, past what
        the hostPaths name on the host (see host_paths)."""
        mounts = [host_paths.Mount("scratch", str(launch.scratch), CONTAINER_SCRATCH, True)]
        mounts += [
            host_paths.Mount(f"volume {v.name}", v.host_path, v.mount_path)
            for v in launch.order.volumes
        ]
        made = (*PODMAN_MOUNTS, *((INIT_MOUNT,) if self.podman.init else ()))
        cwd = str(launch.cwd) if launch.cwd is not None else None
        found = host_paths.problems(mounts, cwd, made, self.allowed_host_paths)
        if found:
            paths = {v.name: v.host_path for v in launch.order.volumes}
            log.warning("container mounts refused", pod=launch.key, problems=found, paths=paths)
            raise StartError(125, f"ContainerError: {'; '.join(found)}")

    async def wait(self, key: str) -> Ending:
        container = self._containers[key]
        try:
            if not container.ended:
                await process.wait_gone(container.conmon)
            return await self._ended(container)
        finally:
            self._containers.pop(key, None)
            if container.watch is not None:  # the container is gone: so is its watch's work
                container.watch.terminate()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(COMMAND_TIMEOUT_S):
                        await process.wait_exit(container.watch)

    async def _ended(self, container: _Container) -> Ending:
        """_ended: how a container whose conmon is gone ended; it is removed after."""
        state = await self.inspections.call(container.name)
        ending = _ending(state, container.workdir)
        if container.log_path is not None:
            why = start_failure.init_said(ending.code, container.log_path, container.command)
            if why:  # the log names the command too, as a launcher's does
                ending = Ending(ending.code, ending.oom, why)
                with contextlib.suppress(OSError), process.open_log(container.log_path) as f:
                    f.write(f"arranger: {why.partition(': ')[2]}\n".encode())
        if ending.code is not None:  # kept, as a shim keeps it, for an agent started again
            _keep_exit(container.exit_file, ending.code)
        await self.removals.call(container.name)  # --force: not ended, it is now
        shutil.rmtree(container.workdir, ignore_errors=True)
        return ending

    def begin(self, key: str, go: bool = True) -> None:
        """begin: a container runs as soon as it starts. It is named after its run, so an
        agent that died before recording it leaves no copy behind: the next one removes every
        container of this node that no record names (`recovered`) before it starts any."""
        if not go:
            self.stop(key, 0)

    def stop(self, key: str, grace_s: float) -> None:
        starting = self._starting.get(key)
        if starting is not None:  # still pulling or creating: give up on it at once
            with contextlib.suppress(ProcessLookupError):
                starting.kill()
            return
        container = self._containers.get(key)
        if container is None:
            return
        stops = self._stops.get(math.ceil(grace_s))
        if stops is None:  # one batch per grace period: `podman stop --time N` takes many
            seconds = math.ceil(grace_s)
            stops = self._stops[seconds] = TurnBatch(
                self._podman_many(
                    "stop",
                    "--ignore",
                    "--time",
                    str(seconds),
                    timeout_s=seconds + COMMAND_TIMEOUT_S,
                )
            )
        task = asyncio.create_task(stops.call(container.name), name=f"stop {container.name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def adopt(self, key: str, record: Mapping[str, Any], exit_file: Path) -> Ending | str | None:
        name = str(record["container"])
        self._claimed.add(name)
        conmon = int(record["pid"])
        code = process.recorded_exit(exit_file)
        if code is None and process.started_at(conmon) == record["started"]:
            self._containers[key] = _Container(name, conmon, exit_file)
            return RUNNING
        # conmon is gone: podman knows how the container ended, if it still has it. Adoption
        # runs before the event loop serves anything, so a blocking call is fine here.
        workdir = _workdir(exit_file)
        ending = _ending(_inspect_now(self.podman, name) if code is None else None, workdir)
        _podman_now(self.podman, *REMOVE, name)
        shutil.rmtree(workdir, ignore_errors=True)
        code = ending.code if code is None else code
        return Ending(code, ending.oom) if code is not None else None

    def recovered(self) -> None:
        """recovered removes this node's containers that no run record names: one an agent
        started but died before it recorded."""
        done = _podman_now(
            self.podman,
            "ps",
            "--all",
            "--filter",
            f"label=arranger.node={self.node_name}",
            "--format",
            "{{.Names}}",
        )
        strays = [n for n in (done or "").split() if n not in self._claimed]
        if strays:
            log.warning("removing containers no run record names", containers=strays)
            _podman_now(self.podman, *REMOVE, *strays)

    async def close(self) -> None:
        """close waits for the stops under way, then removes, in one call, the containers
        whose end the agent did not see (a stop that outlasted the agent's patience)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=COMMAND_TIMEOUT_S)
        left = [c.name for c in self._containers.values()]
        if left:
            log.warning("removing containers still running", containers=left)
            await self._podman(*REMOVE, "--time", "0", *left)
            self._containers.clear()

    def detach(self) -> None:
        for task in self._tasks:
            task.cancel()

    # podman calls.

    async def _inspect_many(self, names: list[str]) -> dict[str, dict[str, Any] | None]:
        """_inspect_many: the State of each container podman still has (one call)."""
        # It exits non-zero when one of them is gone, but still describes the others.
        said = await self._podman("container", "inspect", "--format", "json", *names, partial=True)
        states: dict[str, dict[str, Any] | None] = dict.fromkeys(names)
        with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError):
            for item in json.loads(said or "[]"):
                states[str(item["Name"])] = item["State"]
        return states

    def _podman_many(
        self, *args: str, timeout_s: float = COMMAND_TIMEOUT_S
    ) -> Callable[[list[str]], Awaitable[dict[str, None]]]:
        """_podman_many: a podman command run on many containers at once (`rm`, `stop`)."""

        async def run(names: list[str]) -> dict[str, None]:
            await self._podman(*args, *names, timeout_s=timeout_s)
            return dict.fromkeys(names)

        return run

    async def _podman(
        self, *args: str, timeout_s: float = COMMAND_TIMEOUT_S, partial: bool = False
    ) -> str | None:
        """_podman runs a podman command; its output, or None if it failed (logged; with
        `partial`, what it printed all the same). At most MAX_CALLS run at once: podman
        serialises on its own locks, and a crowd of them only thrashes."""
        async with self._calls:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self.podman.base,
                    *args,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    env=podman_env(),
                )
            except OSError as exc:
                log.warning("podman could not be run", command=args[0], error=str(exc))
                return None
            try:
                async with asyncio.timeout(timeout_s):
                    out, err = await proc.communicate()
            except TimeoutError:
                proc.kill()
                await proc.wait()
                log.warning("podman timed out", command=args[0], timeout_s=timeout_s)
                return None
        if proc.returncode != 0:
            log.info("podman failed", command=args[0], error=_last_line(err.decode()))
            return out.decode() if partial else None
        return out.decode()


def _inspect_now(podman: Podman, name: str) -> dict[str, Any] | None:
    return _state(_podman_now(podman, "container", "inspect", "--format", "{{json .State}}", name))


def _podman_now(podman: Podman, *args: str) -> str | None:
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


@functools.cache
def _die_with_parent() -> list[str]:
    """_die_with_parent: the prefix that makes a command get SIGKILL when the agent ends
    (util-linux setpriv; none where it is missing)."""
    setpriv = launcher.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []


def _workdir(exit_file: Path) -> Path:
    """_workdir: a run's own directory beside its exit file, where only the agent writes:
    conmon's working directory, its pid file, the container's env file."""
    return exit_file.with_suffix(".podman")


def _ending(state: Mapping[str, Any] | None, workdir: Path) -> Ending:
    """_ending: how a container ended, from podman's word on it (`inspect`'s State) and
    conmon's note of an OOM kill; no code if it has not ended or podman no longer has it."""
    oom = (workdir / "oom").exists()
    if state is not None and state.get("Status") in ("exited", "stopped"):
        return Ending(int(state.get("ExitCode", 0)), oom or bool(state.get("OOMKilled")))
    return Ending(None, oom)


def _program(launch: PodLaunch) -> str:
    """_program: what a container runs first: its command, else its image's entrypoint."""
    return launch.order.command[0] if launch.order.command else launch.order.image


def _keep_exit(path: Path, code: int) -> None:
    with contextlib.suppress(OSError), os.fdopen(process.open_private(path), "w") as f:
        f.write(f"{code}\n")


def _read_from(path: Path, offset: int) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(64 * 1024).decode(errors="replace")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _read_int(path: str) -> int:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return 0
