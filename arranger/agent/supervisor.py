"""supervisor runs pods on this node: launch, watch, kill, and report every state change.

Each pod attempt is a PodRun. A run is Launching until its process exists (or, with a readiness
port, until that port accepts connections), then Running, then ends Succeeded (exit 0), Failed
(any other exit, or it could not start) or Killed (the server asked). A runtime (see runtime)
runs the program: a plain process, or a container when the pod names an image; either way a
pod leaves nothing behind when it ends. A plain process given a share of a GPU, on a node that
enforces shares, is held to it by an MPS daemon of its own (see mps), started and told its
limits before the program runs and stopped once it has ended, before its end is reported.

Each started run is recorded in `runs/` under the data directory (its runtime, the pid the
agent watches and that process's start time, ports, and what the runtime needs to find it
again) until the server forgets it. An agent that starts again over the same directory
`recover`s: a run whose exit code is known ended with it; a run that still runs is adopted and
watched; any other run is Lost, because its exit code cannot be known.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from arranger.agent import launcher, logcap, process
from arranger.agent.accounts import Accounts
from arranger.agent.cgroups import DEFAULT_PIDS, Cgroups
from arranger.agent.config import PodUser
from arranger.agent.datadir import PASSABLE, PRIVATE, PRIVATE_FILE, make_dir, make_dirs
from arranger.agent.fence import FenceFiles
from arranger.agent.mps import MpsDaemons, MpsError
from arranger.agent.packages import Fetch, PackageCache, pod_cwd
from arranger.agent.pod_state import (
    Adopted,
    Exited,
    Forgotten,
    Instruction,
    KillOrdered,
    Ordered,
    Pod,
    PodStates,
    Ready,
    RemoveScratch,
    Report,
    Settle,
    Start,
    Started,
    Stop,
    StopAll,
    Unrecord,
)
from arranger.agent.ports import PortAllocator
from arranger.agent.runtime import (
    CONTAINER_SCRATCH,
    RUNNING,
    Ending,
    PodLaunch,
    ProcessRuntime,
    Runtime,
    StartError,
)
from arranger.spec import env_name
from arranger.states import PodState, cannot_start
from arranger.v1 import agent_pb2

log = structlog.get_logger("arranger.agent")

# Variables of the agent's own environment a pod inherits; everything else comes from the spec.
INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "USER", "LOGNAME", "SHELL", "TMPDIR")
READINESS_PROBE_S = 0.1


@dataclass
class PodRun:
    """PodRun is one attempt of one pod on this node: what the shell holds for it (process,
    ports, runtime), and `pod`, its life as the state machine keeps it (see pod_state)."""

    uid: str
    attempt: int
    job_id: str
    pod_name: str
    pod: Pod
    pid: int = 0
    ports: dict[str, int] = field(default_factory=dict)
    start_time: float = 0.0
    runtime: str = ProcessRuntime.kind
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def state(self) -> PodState:
        return self.pod.state

    @property
    def exit_code(self) -> int | None:
        return self.pod.exit_code

    @property
    def reason(self) -> str:
        return self.pod.reason

    @property
    def finish_time(self) -> float:
        return self.pod.finish_time

    @property
    def kill_requested(self) -> bool:
        return self.pod.kill_requested

    def report(self) -> agent_pb2.PodReport:
        msg = agent_pb2.PodReport(
            pod_uid=self.uid,
            attempt=self.attempt,
            state=self.state.value,
            pid=self.pid,
            reason=self.reason,
            ports=self.ports,
            start_time=self.start_time,
            finish_time=self.finish_time,
        )
        if self.exit_code is not None:
            msg.exit_code = self.exit_code
        return msg


class Supervisor:
    """Supervisor owns this node's pod runs; `on_change` is called after every state change."""

    def __init__(
        self,
        node_name: str,
        address: str,
        data_dir: Path,
        on_change: Callable[[PodRun], None],
        path_prepend: tuple[str, ...] = (),
        mps: bool = False,
        user: PodUser | None = None,
        cgroups: Cgroups | None = None,
        why_no_limits: str = "turned off",
        containers: Runtime | None = None,
        tools: launcher.Tools | None = None,
        accounts: Accounts | None = None,
        max_log_bytes: int = 0,
        fence: FenceFiles | None = None,
        fetch_package: Fetch | None = None,
        pids: int = DEFAULT_PIDS,
        mps_daemons: MpsDaemons | None = None,
    ) -> None:
        """`accounts`: who each pod runs as (default: `user`, or the agent's own user);
        `max_log_bytes`: how much of each attempt's log is kept (0: all; see logcap);
        `cgroups`: where plain processes get their limits (None: nowhere, `why_no_limits`);
        `containers`: the runtime of pods that name an image (None: this node has none);
        `tools`: what starts plain processes (default: found on this machine);
        `fence`: what plain processes' shims watch to fence them while no agent runs;
        `fetch_package`: what streams a job's package from the server (see packages);
        `pids`: a pod's pids limit unless it asks another (0: none but the machine's);
        `mps_daemons`: where plain processes given a share of a GPU are held to it (None: their
        shares are promised only; see mps)."""
        self.node_name = node_name
        self.address = address
        self.data_dir = data_dir
        self.on_change = on_change
        self.runs: dict[str, PodRun] = {}
        self.states = PodStates()
        self._replaced: dict[tuple[str, int], PodRun] = {}  # live runs a newer order replaced
        self._orders: dict[tuple[str, int], agent_pb2.LaunchPod] = {}  # until started
        self._job_dirs: set[str] = set()  # jobs whose logs/, scratch/ and runs/ directories exist
        self.ports = PortAllocator()
        self.mps = mps
        self.mps_daemons = mps_daemons
        self.accounts = accounts or Accounts(node_name, fixed=user)
        self.max_log_bytes = max_log_bytes
        self.tools = tools or launcher.find_tools(switching=self.accounts.switching)
        self.processes = ProcessRuntime(self.tools, cgroups, why_no_limits, fence, pids)
        self.packages = (
            PackageCache(data_dir / "packages", fetch_package, self.tools.python)
            if fetch_package is not None
            else None
        )
        self.containers = containers
        self._tasks: set[asyncio.Task[None]] = set()
        base = {k: v for k in INHERITED_ENV if (v := os.environ.get(k)) is not None}
        if path_prepend:
            base["PATH"] = os.pathsep.join([*path_prepend, base.get("PATH", os.defpath)])
        self.base_env = base

    # Paths.

    def log_path(self, uid: str, attempt: int) -> Path:
        job_id, _, pod = uid.partition("/")
        return self.data_dir / "logs" / job_id / pod / f"{attempt}.log"

    def scratch_dir(self, uid: str) -> Path:
        job_id, _, pod = uid.partition("/")
        return self.data_dir / "scratch" / job_id / pod

    def record_path(self, uid: str) -> Path:
        job_id, _, pod = uid.partition("/")
        return self.data_dir / "runs" / job_id / f"{pod}.json"

    def exit_path(self, uid: str, attempt: int) -> Path:
        job_id, _, pod = uid.partition("/")
        return self.data_dir / "runs" / job_id / f"{pod}.{attempt}.exit"

    # Runs that outlive the agent.

    @property
    def runtimes(self) -> list[Runtime]:
        return [self.processes] + ([self.containers] if self.containers is not None else [])

    def _runtime(self, kind: str) -> Runtime | None:
        return next((r for r in self.runtimes if r.kind == kind), None)

    @staticmethod
    def _key(run: PodRun) -> str:
        return f"{run.uid}.{run.attempt}"

    def _record(self, run: PodRun, started: float, extra: Mapping[str, Any]) -> None:
        """_record notes a started run (written whole, then renamed into place)."""
        path = self.record_path(run.uid)
        body = {
            **extra,
            "uid": run.uid,
            "attempt": run.attempt,
            "job_id": run.job_id,
            "pod_name": run.pod_name,
            "runtime": run.runtime,
            "pid": run.pid,
            "started": started,
            "start_time": run.start_time,
            "ports": run.ports,
        }
        part = path.with_suffix(".part")
        fd = process.open_private(part)
        try:
            os.write(fd, json.dumps(body).encode())
        finally:
            os.close(fd)
        os.replace(part, path)

    def _unrecord(self, uid: str) -> None:
        """_unrecord removes the run's record and every attempt's exit and kill files."""
        path = self.record_path(uid)
        prefix = f"{path.stem}."
        with contextlib.suppress(OSError), os.scandir(path.parent) as entries:
            for entry in entries:
                name = entry.name
                if name.startswith(prefix) and name.endswith((".exit", ".kill")):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
        path.unlink(missing_ok=True)

    def recover(self) -> list[PodRun]:
        """recover takes back the runs recorded by an earlier agent on this data directory:
        ended (exit code recorded), adopted (still running) or Lost. Call before launching."""
        found: list[PodRun] = []
        for path in sorted((self.data_dir / "runs").glob("*/*.json")):
            try:
                body = json.loads(path.read_text())
                uid, attempt = body["uid"], int(body["attempt"])
                run = PodRun(uid, attempt, body["job_id"], body["pod_name"], Pod(uid, attempt))
                run.pid, run.start_time = int(body["pid"]), float(body["start_time"])
                run.ports = {str(k): int(v) for k, v in body["ports"].items()}
                run.runtime = str(body.get("runtime", ProcessRuntime.kind))
                runtime = self._runtime(run.runtime)
                if runtime is None:
                    raise ValueError(f"this agent has no {run.runtime} runtime")
                kill_file = self.exit_path(run.uid, run.attempt).with_suffix(".kill")
                kill_reason = ""
                if kill_file.exists():
                    kill_reason = kill_file.read_text().strip() or "Killed"
                taken = runtime.adopt(self._key(run), body, self.exit_path(run.uid, run.attempt))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                log.warning("unreadable run record", path=str(path), error=str(exc))
                continue
            self.runs[run.uid] = run
            found.append(run)
            running = taken == RUNNING
            ending = taken if isinstance(taken, Ending) else Ending(None)
            adopted = Adopted(
                run.uid,
                run.attempt,
                running,
                time.time(),
                ending.code,
                ending.oom,
                kill_reason,
                None if running else self._recorded_end(run),
            )
            instructions = self.states.handle(adopted)
            run.pod = self.states.pods[run.uid]
            self._do(instructions)
            if running:
                self.ports.in_use.update(run.ports.values())
                self._spawn_task(self._follow(run, runtime), f"adopted pod {run.uid}")
                self._cap_log(run)
                log.info("pod adopted", pod=run.uid, attempt=run.attempt, pid=run.pid)
        for runtime in self.runtimes:
            runtime.recovered()
        if self.mps_daemons is not None:  # adopted pods keep theirs; the rest are stopped
            left = self.mps_daemons.adopt([self._key(r) for r in found if not r.ended.is_set()])
            if left:
                self._spawn_task(self.mps_daemons.sweep(left), "MPS daemons left behind")
        if self.processes.cgroups is not None:  # empty ones of pods that ended unwatched
            self.processes.cgroups.sweep({self._key(r) for r in found if not r.ended.is_set()})
        return found

    def _recorded_end(self, run: PodRun) -> float:
        """_recorded_end: when the run ended, as its shim (or container monitor) recorded it,
        writing the exit file; now where there is none. A run that ended while no agent was
        there keeps its own end time, not the next agent's start."""
        now = time.time()
        try:
            recorded = self.exit_path(run.uid, run.attempt).stat()
        except OSError:
            return now
        # An empty file is only the one opened for the shim at launch: no exit was recorded.
        return min(recorded.st_mtime, now) if recorded.st_size > 0 else now

    async def _follow(self, run: PodRun, runtime: Runtime) -> None:
        """_follow waits for a run's end and settles it."""
        ending = await runtime.wait(self._key(run))
        await self._release_share(run)
        self._exited(run, ending)

    def _exited(self, run: PodRun, ending: Ending) -> None:
        ended = self._recorded_end(run)
        exited = Exited(run.uid, run.attempt, ending.code, ended, ending.oom, ending.reason)
        self._do(self.states.handle(exited))

    # Carrying out the state machine's instructions.

    def _run_of(self, uid: str, attempt: int) -> PodRun | None:
        run = self.runs.get(uid)
        if run is not None and run.attempt == attempt:
            return run
        return self._replaced.get((uid, attempt))

    def _do(self, instructions: list[Instruction]) -> None:
        """_do carries out what the state machine says, in its order."""
        for instruction in instructions:
            match instruction:
                case Start(uid, attempt):
                    self._start(uid, attempt)
                case Stop(uid, attempt, grace_s, reason):
                    if (run := self._run_of(uid, attempt)) is not None:
                        self._stop(run, grace_s, reason)
                case Report(uid, attempt):
                    if (run := self._run_of(uid, attempt)) is not None:
                        self.on_change(run)
                case Settle(uid, attempt):
                    if (run := self._run_of(uid, attempt)) is not None:
                        self._settle(run)
                case RemoveScratch(uid):
                    shutil.rmtree(self.scratch_dir(uid), ignore_errors=True)
                case Unrecord(uid):
                    self.runs.pop(uid, None)
                    self._unrecord(uid)

    def _start(self, uid: str, attempt: int) -> None:
        order = self._orders.pop((uid, attempt))
        current = self.runs.get(uid)
        if current is not None and not current.ended.is_set():
            self._replaced[(uid, current.attempt)] = current
        pod = self.states.pods[uid]
        run = PodRun(uid, attempt, order.job_id, order.pod_name, pod)
        self.runs[uid] = run
        self._spawn_task(self._run(run, order), f"pod {uid}")

    def _spawn_task(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # Orders.

    def launch(self, order: agent_pb2.LaunchPod) -> None:
        self._orders[(order.pod_uid, order.attempt)] = order
        self._do(self.states.handle(Ordered(order.pod_uid, order.attempt, order.grace_s)))
        self._orders.pop((order.pod_uid, order.attempt), None)  # a repeated order

    def kill(self, order: agent_pb2.KillPod) -> None:
        kill = KillOrdered(order.pod_uid, order.attempt, order.grace_s, order.remove_scratch)
        self._do(self.states.handle(kill))

    def forget(self, uid: str) -> None:
        self._do(self.states.handle(Forgotten(uid)))

    def kept_jobs(self, most: int) -> list[str]:
        """kept_jobs: the jobs (at most `most`) this agent keeps logs, scratch or run records
        of, on disk."""
        found: set[str] = set()
        for kind in ("logs", "scratch", "runs"):
            with contextlib.suppress(OSError):
                found.update(
                    entry.name
                    for entry in os.scandir(self.data_dir / kind)
                    if entry.is_dir(follow_symlinks=False)
                )
        return sorted(found)[:most]

    def purge(self, job_id: str) -> None:
        """purge removes a deleted job's logs and scratch directories; never those of a job
        with a pod still running here (its run records keep it adoptable)."""
        if any(r.job_id == job_id and not r.ended.is_set() for r in self.runs.values()):
            log.warning("purge refused: the job still runs here", job=job_id)
            return
        for uid in [u for u, r in self.runs.items() if r.job_id == job_id and r.ended.is_set()]:
            self._do(self.states.handle(Forgotten(uid)))
        self._job_dirs.discard(job_id)
        if self.packages is not None:
            self.packages.release(job_id)
        for kind in ("logs", "scratch", "runs"):
            shutil.rmtree(self.data_dir / kind / job_id, ignore_errors=True)

    async def shutdown(self, grace_s: float, reason: str = "Killed") -> None:
        """shutdown kills every pod still running, each ending Killed with `reason`, and waits
        for them to end."""
        self.stop_all(grace_s, reason)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=grace_s + 5)
        for runtime in self.runtimes:
            await runtime.close()

    def stop_all(self, grace_s: float, reason: str) -> None:
        """stop_all asks every pod still running to end; each ends Killed with `reason`."""
        self._do(self.states.handle(StopAll(reason, grace_s)))

    async def detach(self) -> None:
        """detach lets go of every pod without stopping any: what watches, probes and trims
        them ends here, and their run records stay for the next agent to adopt them."""
        for runtime in self.runtimes:
            runtime.detach()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # A run's life.

    async def _run(self, run: PodRun, order: agent_pb2.LaunchPod) -> None:
        log_path = self.log_path(run.uid, run.attempt)
        runtime: Runtime | None = self.processes
        if order.image:
            runtime = self.containers
            run.runtime = runtime.kind if runtime is not None else "container"
        try:
            launch = self._launch(run, order, log_path, container=bool(order.image))
            if runtime is None:
                raise StartError(125, "NoContainerRuntime: this node cannot run images")
            if order.package.sha256:
                await self._unpack(order, launch)
            launch = await self._hold_share(run, order, launch)
            started = await runtime.start(launch)
        except (OSError, StartError) as exc:
            await self._release_share(run)
            failure = exc if isinstance(exc, StartError) else StartError(126, f"StartError: {exc}")
            if not run.kill_requested:  # stopped while it started: nothing to tell
                why = failure.reason.partition(": ")[2] if cannot_start(failure.reason) else ""
                why = why or f"cannot start {list(order.command)}: {exc}"
                self._note_in_log(log_path, f"arranger: {why}")
            self._exited(run, Ending(failure.code, reason=failure.reason))
            return
        run.pid, run.start_time = started.pid, time.time()
        key = self._key(run)
        try:
            self._record(run, started.started_at, started.record)
        except OSError as exc:  # unrecorded, it must not run: no next agent could find it
            runtime.begin(key, go=False)
            await runtime.wait(key)
            await self._release_share(run)
            self._note_in_log(log_path, f"arranger: cannot record the run: {exc}")
            self._exited(run, Ending(126, reason=f"StartError: cannot record the run: {exc}"))
            return
        runtime.begin(key, go=not run.kill_requested)
        self._cap_log(run)
        probe = None
        ready = not (order.readiness_port and order.readiness_port in run.ports)
        self._do(self.states.handle(Started(run.uid, run.attempt, run.start_time, ready)))
        if not ready:
            probe = asyncio.create_task(self._probe(run, run.ports[order.readiness_port]))
        ending = await runtime.wait(key)
        if probe is not None:
            probe.cancel()
        await self._release_share(run)
        self._exited(run, ending)

    async def _hold_share(
        self, run: PodRun, order: agent_pb2.LaunchPod, launch: PodLaunch
    ) -> PodLaunch:
        """_hold_share starts the MPS daemon that holds a plain process given a share of a GPU
        to it (see mps), before its program runs, and returns the launch with the pod's part
        of it in its environment; a pod it cannot hold does not start (StartError). Pods with
        whole GPUs, and containers (their MPS directories are not mounted in yet), run as
        they would without MPS."""
        if self.mps_daemons is None:
            return launch
        grants = [(g.index, g.share) for g in order.gpus]
        held = self.mps_daemons.share_of(self._key(run), grants)
        if held is None:
            return launch
        if order.image:
            log.warning("a container's GPU share is not held by MPS", pod=run.uid)
            return launch
        user = launch.user
        owner = (user.uid, user.gid) if user is not None and os.geteuid() == 0 else None
        try:
            await self.mps_daemons.start(held, owner)
        except MpsError as exc:
            why = f"StartError: cannot hold the GPU share with MPS: {exc}"
            raise StartError(126, why) from None
        return dataclasses.replace(launch, env={**launch.env, **held.pod_env(launch.env)})

    async def _release_share(self, run: PodRun) -> None:
        """_release_share stops the run's MPS daemon, once its program has ended."""
        if self.mps_daemons is not None:
            await self.mps_daemons.stop(self._key(run))

    def _launch(
        self, run: PodRun, order: agent_pb2.LaunchPod, log_path: Path, container: bool
    ) -> PodLaunch:
        """_launch prepares a run's account, directories, log, ports and environment. What is
        the pod's (its scratch directory, its log) belongs to its account and no one else may
        read it; the directories above let others pass but not list; the run's records stay
        the agent's alone."""
        self._pod_dir(run.uid, log_path.parent, PASSABLE)
        log_fd = process.log_fd(log_path)  # first, to tell why if it cannot start
        try:
            os.fchmod(log_fd, PRIVATE_FILE)
            user = self.accounts.for_pod(order.owner)
            owner = (user.uid, user.gid) if user is not None and os.geteuid() == 0 else None
            if owner is not None:
                os.fchown(log_fd, *owner)
        finally:
            os.close(log_fd)
        scratch = self.scratch_dir(run.uid)
        self._pod_dir(run.uid, scratch, PRIVATE, owner)
        exit_file = self.exit_path(run.uid, run.attempt)
        run.ports = self.ports.allocate(dict(order.ports))
        env = self._environment(order, run.ports, scratch, container, user)
        return PodLaunch(
            key=self._key(run),
            argv=[*order.command, *order.args],
            env=env,
            cwd=pod_cwd(order, scratch, container),
            scratch=scratch,
            log_path=log_path,
            exit_file=exit_file,
            order=order,
            user=user,
        )

    async def _unpack(self, order: agent_pb2.LaunchPod, launch: PodLaunch) -> None:
        """_unpack gives the pod its own copy of its job's package (see packages), unpacked as
        the pod's processes start and within their limits, whatever runtime runs the pod."""
        if self.packages is None:
            raise StartError(126, "PackageUnavailable: this agent cannot fetch packages")
        unpacker = self.packages.unpacker_for(launch, self.processes)
        await self.packages.unpack_into(
            order.package, launch.scratch, launch.user, order.job_id, unpacker
        )

    def _pod_dir(
        self, uid: str, path: Path, mode: int, owner: tuple[int, int] | None = None
    ) -> None:
        """_pod_dir makes one of pod `uid`'s directories. Its job's directories above are made
        once per job (and made again if they went missing meanwhile); `purge` forgets them."""
        job_id = uid.partition("/")[0]
        for again in (False, True):
            if job_id not in self._job_dirs:
                for kind, kind_mode in (
                    ("logs", PASSABLE),
                    ("scratch", PASSABLE),
                    ("runs", PRIVATE),
                ):
                    make_dirs(self.data_dir, Path(kind, job_id), kind_mode)
                self._job_dirs.add(job_id)
            try:
                make_dir(path, mode, owner)
                return
            except FileNotFoundError:
                self._job_dirs.discard(job_id)
                if again:
                    raise

    def _environment(
        self,
        order: agent_pb2.LaunchPod,
        ports: Mapping[str, int],
        scratch: Path,
        container: bool = False,
        user: PodUser | None = None,
    ) -> dict[str, str]:
        """_environment: the contract of DESIGN §6. A container gets no variable of the
        agent's own (its image has its PATH and HOME), and its paths as it sees them; a
        process run as another account gets that account's HOME, USER and LOGNAME."""
        env = {} if container else dict(self.base_env)
        if user is not None and not container:
            env.update(HOME=user.home, USER=user.name, LOGNAME=user.name)
        env.update(order.env)
        env["ARRANGER_NODE_NAME"] = self.node_name
        env["ARRANGER_SCRATCH_DIR"] = CONTAINER_SCRATCH if container else str(scratch)
        if container:
            for volume in order.volumes:
                env[f"ARRANGER_VOLUME_{env_name(volume.name)}"] = volume.mount_path
        for name, number in ports.items():
            env[f"ARRANGER_PORT_{env_name(name)}"] = str(number)
        if order.leader_port_name and order.leader_port_name in ports:
            port = ports[order.leader_port_name]
            env["ARRANGER_LEADER_HOST"] = self.address
            env["ARRANGER_LEADER_PORT"] = str(port)
            env["ARRANGER_LEADER_ADDR"] = f"{self.address}:{port}"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g.index) for g in order.gpus)
        if len(order.gpus) == 1 and order.gpus[0].share < 1:
            share = order.gpus[0].share
            env["ARRANGER_GPU_FRACTION"] = f"{share:g}"
            if self.mps:  # NVIDIA MPS caps the share of the GPU's threads the process may use
                env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, round(share * 100)))
        return env

    async def _probe(self, run: PodRun, port: int) -> None:
        """_probe marks the run Running once its readiness port accepts a connection."""
        while not run.ended.is_set():
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(READINESS_PROBE_S)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            self._do(self.states.handle(Ready(run.uid, run.attempt)))
            return

    def _cap_log(self, run: PodRun) -> None:
        """_cap_log keeps the run's log within max_log_bytes while it runs, and once more
        when it has ended (see logcap)."""
        if self.max_log_bytes <= 0:
            return
        path = self.log_path(run.uid, run.attempt)

        async def keep() -> None:
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(logcap.CHECK_S):
                        await run.ended.wait()
                try:
                    if os.stat(path).st_size > self.max_log_bytes:  # else nothing to drop
                        logcap.trim(path, self.max_log_bytes)
                except OSError as exc:  # purged meanwhile, or a filesystem that refuses
                    log.warning("cannot keep the log small", pod=run.uid, error=str(exc))
                    return
                if run.ended.is_set():
                    return

        self._spawn_task(keep(), f"log of {run.uid}")

    def _stop(self, run: PodRun, grace_s: float, reason: str) -> None:
        if run.pid:  # an agent started again must know it too (again: it may have started since)
            with contextlib.suppress(OSError):
                fd = process.open_private(self.exit_path(run.uid, run.attempt).with_suffix(".kill"))
                try:
                    os.write(fd, reason.encode())
                finally:
                    os.close(fd)
        runtime = self._runtime(run.runtime)
        if runtime is not None:  # a run still starting may be stopped too (a long pull)
            runtime.stop(self._key(run), grace_s)

    def _settle(self, run: PodRun) -> None:
        """_settle frees what an ended run held and reports its end."""
        self._replaced.pop((run.uid, run.attempt), None)
        self.ports.release(run.ports)
        if run.pod.remove_scratch:
            shutil.rmtree(self.scratch_dir(run.uid), ignore_errors=True)
        run.ended.set()
        log.info(
            "pod ended", pod=run.uid, attempt=run.attempt, state=run.state.value, reason=run.reason
        )
        self.on_change(run)

    @staticmethod
    def _note_in_log(path: Path, line: str) -> None:
        with contextlib.suppress(OSError), open(path, "a") as f:
            f.write(line + "\n")
