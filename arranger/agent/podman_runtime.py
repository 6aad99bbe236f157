"""podman_runtime: PodmanRuntime, which runs pods whose template names an image in containers.

`podman run --detach` (see podman.run_argv for what a container gets) starts the container
under conmon, podman's per-container monitor, which outlives the agent; the agent watches
conmon's pid as it watches a shim's, and asks podman how the container ended (`inspect`)
before it removes it. Containers are named and labelled after the node and the pod attempt
(`arranger.node`, `arranger.pod`, `arranger.attempt`), so an agent started again finds its own
by name.

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
import shutil
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from arranger.agent import host_paths, launcher, process, start_failure
from arranger.agent.batching import TurnBatch
from arranger.agent.cgroups import DEFAULT_PIDS
from arranger.agent.fence import FenceFiles
from arranger.agent.podman import (
    COMMAND_TIMEOUT_S,
    CPU_AT_START,
    Containers,
    Podman,
    container_name,
    inspect_now,
    last_line,
    podman_env,
    podman_now,
    run_argv,
)
from arranger.agent.runtime import (
    CONTAINER_SCRATCH,
    RUNNING,
    Ending,
    PodLaunch,
    Started,
    StartError,
)

log = structlog.get_logger("arranger.agent")

START_TIMEOUT_S = 600.0  # a pull may take long, but not forever
MOUNT_CHECK_S = 30.0  # the walk of a container's host paths, at most
MAX_CALLS = 4  # podman commands at once
REMOVE = ("rm", "--force", "--ignore")  # a container, running or not, or already gone
# Where podman mounts files of its own in every container (INIT_MOUNT: with --init), outside
# /dev, /proc and /sys, where no volume may go (host_paths).
PODMAN_MOUNTS = ("/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/run/.containerenv")
INIT_MOUNT = "/run/podman-init"


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
        self.settings = Containers(podman, node_name, limits, pull, pids, dev)
        self.allowed_host_paths = allowed_host_paths
        self.podman = podman
        self.fence = fence
        self.node_name = node_name
        self.limits = limits
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

    def run_argv(
        self, launch: PodLaunch, env_file: Path, conmon_pidfile: Path | None = None
    ) -> list[str]:
        """run_argv: the `podman run` command of `launch` on this node (see podman.run_argv)."""
        return run_argv(self.settings, launch, env_file, conmon_pidfile)

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
            if self.limits and 0 < order.cpu_cores < CPU_AT_START:
                await self._podman("update", f"--cpus={order.cpu_cores:g}", name)
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
            output = _read_from(launch.log_path, offset)
            image = launch.order.image
            reason = start_failure.podman_run(
                code, last_line(output), _program(launch), output, image
            )
            raise StartError(code, reason)

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
        ending = _ending(inspect_now(self.podman, name) if code is None else None, workdir)
        podman_now(self.podman, *REMOVE, name)
        shutil.rmtree(workdir, ignore_errors=True)
        code = ending.code if code is None else code
        return Ending(code, ending.oom) if code is not None else None

    def recovered(self) -> None:
        """recovered removes this node's containers that no run record names: one an agent
        started but died before it recorded."""
        done = podman_now(
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
            podman_now(self.podman, *REMOVE, *strays)

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
            log.info("podman failed", command=args[0], error=last_line(err.decode()))
            return out.decode() if partial else None
        return out.decode()


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
