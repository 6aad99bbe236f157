"""runtime is how a pod's program is started, watched, stopped and taken back after a restart.

The supervisor owns a pod's life (states, ports, records, reports); a runtime owns its program.
Two exist: `ProcessRuntime` runs the command as a plain process under a shim (see process),
and `PodmanRuntime` (see podman) runs it in a container when the template names an image.

Each run is known to its runtime by its key, `<pod uid>.<attempt>`, unique on a node. A runtime
returns from `start` once the program exists, and `wait` returns how it ended. An `Ending`
without a code is an end nobody recorded (its process vanished while no agent watched).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import structlog

from arranger.agent import launcher, process
from arranger.agent.cgroups import DEFAULT_PIDS, Cgroups, PodCgroup, pids_ceiling, pod_pids
from arranger.agent.config import PodUser
from arranger.agent.fence import FenceFiles
from arranger.agent.orders import LaunchOrder

log = structlog.get_logger("arranger.agent")


class StartError(Exception):
    """StartError: the pod's program could not be started; `code` is its exit code (127: not
    found, 126: could not be run), `reason` what the pod's status says."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(frozen=True)
class PodLaunch:
    """PodLaunch: what a runtime needs to start one pod attempt.

    `env` is the whole environment contract (DESIGN §6) as the pod must see it; `cwd` is None
    when the pod did not ask for a working directory. `exit_file` is where the run's exit code
    is kept (in a directory only the agent writes); `scratch` the pod's own directory. `user`
    is the account the pod runs as (None: the agent's own).
    """

    key: str
    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: Path | None
    scratch: Path
    log_path: Path
    exit_file: Path
    order: LaunchOrder
    user: PodUser | None = None


def exec_record(launch: PodLaunch) -> dict[str, Any]:
    """exec_record: what a run's record keeps so that commands may run as its pod does: its
    environment, working directory and account by number (the agent's own, when the pod
    ran as the agent: an agent started again as another user still runs commands as it)."""
    user = launch.user
    ids = (user.uid, user.gid, list(user.groups)) if user is not None else None
    return {
        "env": dict(launch.env),
        "cwd": str(launch.cwd or launch.scratch),
        "user": ids or [os.geteuid(), os.getegid(), os.getgroups()],
    }


@dataclass(frozen=True)
class Started:
    """Started: the process the agent watches (pid and its start time) and what else the run
    record must keep for the runtime to take the run back (`record`)."""

    pid: int
    started_at: float
    record: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Ending:
    """Ending: the exit code (None: not recorded), whether the kernel killed the pod for
    exceeding its memory, and why it failed when its program never ran (`reason`)."""

    code: int | None
    oom: bool = False
    reason: str = ""


CONTAINER_SCRATCH = "/arranger/scratch"  # where a container sees its pod's scratch directory
RUNNING = "running"  # what `adopt` says of a run that still runs: `wait` follows it


class Runtime(Protocol):
    """Runtime is the small interface the supervisor drives."""

    kind: str  # recorded with each run: "process" or "podman"
    description: str  # what the agent reports in its runtimes: "process (cgroup v1)"

    async def start(self, launch: PodLaunch) -> Started:
        """start runs the pod; raises StartError when it cannot. A runtime whose runs an agent
        that dies now could not find again holds the pod's own program back until `begin`."""
        ...

    def begin(self, key: str, go: bool = True) -> None:
        """begin lets a started run's program begin, once the run is recorded (so that an agent
        that dies in between leaves no run that the next one cannot adopt); with `go` False it
        never begins, and the run ends at once."""
        ...

    async def wait(self, key: str) -> Ending:
        """wait returns once the run (started or adopted) has ended, its leftovers gone."""
        ...

    def stop(self, key: str, grace_s: float) -> None:
        """stop asks the run to end: SIGTERM, then SIGKILL after grace_s (at once if 0)."""
        ...

    def adopt(self, key: str, record: Mapping[str, Any], exit_file: Path) -> Ending | str | None:
        """adopt takes back a run recorded by an earlier agent: its Ending if it ended with
        a known code, RUNNING if it still runs (then `wait` follows it), None if it is gone."""
        ...

    def recovered(self) -> None:
        """recovered: every recorded run has been offered to `adopt`; what the runtime still
        holds for this node beyond them is stray."""
        ...

    async def close(self) -> None:
        """close releases what the runtime holds for this node once every run has ended."""
        ...

    def detach(self) -> None:
        """detach gives up what it does for runs (stops under way) and leaves every run as it
        is, for the next agent to adopt; `wait`s are cancelled by the supervisor."""
        ...


@dataclass
class _Process:
    pid: int
    exit_file: Path
    child: subprocess.Popen[bytes] | None = None
    cgroup: PodCgroup | None = None
    spec: int | None = None  # the launcher's memfd, where it says why it could not start
    gate: int | None = None  # the write end of the shim's gate, until the run begins
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class ProcessRuntime:
    """ProcessRuntime runs a pod as a plain process in its own process group, under the shim
    (which fences it while no agent runs, given `fence`),
    as the launch's user, in a cgroup of its own with its request's limits where the node
    has cgroups. A stop signals the whole group. A program that could not be started (not
    found, not runnable) ends the run with exit code 127 or 126 and the launcher's reason
    (see launcher)."""

    kind = "process"

    def __init__(
        self,
        tools: launcher.Tools,
        cgroups: Cgroups | None = None,
        why_no_limits: str = "turned off",
        fence: FenceFiles | None = None,
        pids: int = DEFAULT_PIDS,
    ) -> None:
        """`pids`: a pod's pids limit unless it asks for another (0: none)."""
        self.tools = tools
        self.fence = fence
        self.cgroups = cgroups
        self.pids = pids
        self.nproc = pids_ceiling()
        limits = cgroups.description if cgroups else f"no limits: {why_no_limits}"
        self.description = f"process ({limits})"
        self._runs: dict[str, _Process] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, launch: PodLaunch) -> Started:
        cgroup = self._cgroup(launch)
        gate, held = os.pipe2(os.O_CLOEXEC)  # the shim waits on `gate` (see process.SHIM)
        try:
            child, spec = process.spawn(
                launch.argv,
                launch.env,
                launch.cwd or launch.scratch,
                launch.log_path,
                launch.exit_file,
                self.tools,
                launch.user,
                cgroup.procs if cgroup else (),
                self.fence,
                gate,
                self.nproc,
            )
        except (OSError, launcher.LaunchError) as exc:
            os.close(held)
            if cgroup is not None:
                cgroup.remove()
            raise StartError(126, f"StartError: {exc}") from exc
        finally:
            os.close(gate)
        self._runs[launch.key] = _Process(child.pid, launch.exit_file, child, cgroup, spec, held)
        return Started(child.pid, process.started_at(child.pid) or 0.0)

    def _cgroup(self, launch: PodLaunch) -> PodCgroup | None:
        """_cgroup: the pod's new cgroup, with its limits and device filter. Where it cannot be
        made the pod runs without limits, as on a node without cgroups, but never without
        the device filter the node says it holds: it does not start (StartError)."""
        if self.cgroups is None:
            return None
        order = launch.order
        pids = pod_pids(order.pids, self.pids, self.nproc)
        gpus = [g.index for g in order.gpus]
        try:
            return self.cgroups.create(
                launch.key, order.memory_bytes, round(order.cpu_cores * 1000), pids, gpus
            )
        except OSError as exc:
            if self.cgroups.isolates:
                why = exc.strerror or str(exc)
                raise StartError(126, f"StartError: no GPU device filter: {why}") from exc
            log.warning("pod runs without limits", pod=launch.key, error=str(exc))
            return None

    def cgroup_procs(self, key: str) -> tuple[Path, ...]:
        """cgroup_procs: the cgroup.procs files of the run's cgroups (none where it has none)."""
        run = self._runs.get(key)
        return run.cgroup.procs if run is not None and run.cgroup is not None else ()

    def begin(self, key: str, go: bool = True) -> None:
        run = self._runs.get(key)
        if run is None or run.gate is None:
            return
        held, run.gate = run.gate, None
        try:
            if go:
                os.write(held, b"go\n")
        except OSError:  # the shim is gone (stopped before it began): nothing to let go
            pass
        finally:
            os.close(held)

    async def wait(self, key: str) -> Ending:
        run = self._runs[key]
        try:
            if run.child is not None:
                code: int | None = await process.wait_exit(run.child)
            else:
                await process.wait_gone(run.pid)
                code = process.recorded_exit(run.exit_file)
            process.signal_group(run.pid, signal.SIGKILL)  # whatever it left behind
            oom = self._release(run)
            failed = launcher.failure(run.spec) if run.spec is not None else None
            if failed is not None and failed[0] == code:
                return Ending(code, oom, failed[1])
            return Ending(code, oom)
        finally:
            if run.spec is not None:
                os.close(run.spec)
            run.ended.set()
            del self._runs[key]

    def _release(self, run: _Process) -> bool:
        """_release kills what is left in the run's cgroup (processes that left its process
        group) and removes the cgroup; returns whether the kernel killed a process there for
        memory. Removal may fail while they die: Cgroups.close sweeps it later."""
        if run.cgroup is None:
            return False
        oom = run.cgroup.oom_killed()
        run.cgroup.kill()
        run.cgroup.remove()
        return oom

    def stop(self, key: str, grace_s: float) -> None:
        run = self._runs.get(key)
        if run is None:
            return
        process.signal_group(run.pid, signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
        if grace_s > 0:
            task = asyncio.create_task(self._escalate(run, grace_s), name=f"escalate {key}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _escalate(run: _Process, grace_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_s):
                await run.ended.wait()
            return
        process.signal_group(run.pid, signal.SIGKILL)

    def adopt(self, key: str, record: Mapping[str, Any], exit_file: Path) -> Ending | str | None:
        cgroup = self.cgroups.existing(key) if self.cgroups is not None else None
        code = process.recorded_exit(exit_file)
        pid = int(record["pid"])
        if code is None and process.started_at(pid) == record["started"]:
            self._runs[key] = _Process(pid, exit_file, None, cgroup)
            return RUNNING
        ended = _Process(pid, exit_file, None, cgroup)  # whatever of it outlived its shim goes
        oom = self._release(ended)
        return Ending(code, oom) if code is not None else None

    def recovered(self) -> None:
        """recovered: nothing to do; a process no record names cannot be told from others."""

    async def close(self) -> None:
        if self.cgroups is not None:
            self.cgroups.close()

    def detach(self) -> None:
        for task in self._tasks:
            task.cancel()
