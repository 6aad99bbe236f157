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
import os
import shutil
import time
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

import structlog

from arranger.agent import launcher, logcap, process
from arranger.agent.accounts import Accounts
from arranger.agent.cgroups import DEFAULT_PIDS, Cgroups
from arranger.agent.config import PodUser
from arranger.agent.datadir import PASSABLE, PRIVATE, PRIVATE_FILE
from arranger.agent.environment import NodeEnvironment, inherited_env, pod_environment
from arranger.agent.fence import FenceFiles
from arranger.agent.mps import MpsDaemons
from arranger.agent.orders import KillOrder, LaunchOrder
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
from arranger.agent.runs import PodRun, RunFiles
from arranger.agent.runtime import (
    RUNNING,
    Ending,
    PodLaunch,
    ProcessRuntime,
    Runtime,
    StartError,
    exec_record,
)
from arranger.agent.shares import HeldShare
from arranger.states import cannot_start

log = structlog.get_logger("arranger.agent")

READINESS_PROBE_S = 0.1


class Supervisor:
    """Supervisor owns this node's pod runs; `on_change` is called after every state change.
    Which attempts exist, and in what phase, is the state machine's (`states`); the
    supervisor keeps, for each attempt it knows, only what the shell holds (a PodRun)."""

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
        gpu_uuids: Mapping[int, str] | None = None,
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
        shares are promised only; see mps); `gpu_uuids`: the UUIDs of this node's real GPUs
        by index, which containers name their GPUs by (see environment)."""
        self.node_name = node_name
        self.address = address
        self.data_dir = data_dir
        self.on_change = on_change
        self.files = RunFiles(data_dir)
        self.states = PodStates()
        self._runs: dict[tuple[str, int], PodRun] = {}  # each attempt `states` knows
        self.ports = PortAllocator()
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
        self.environment = NodeEnvironment(
            node_name, address, inherited_env(os.environ, path_prepend), mps, gpu_uuids or {}
        )

    @property
    def runs(self) -> dict[str, PodRun]:
        """runs: the current attempt of every pod this node knows, by pod uid."""
        return {
            uid: run
            for uid, pod in self.states.pods.items()
            if (run := self._runs.get((uid, pod.attempt))) is not None
        }

    @property
    def runtimes(self) -> list[Runtime]:
        return [self.processes] + ([self.containers] if self.containers is not None else [])

    def _runtime(self, kind: str) -> Runtime | None:
        return next((r for r in self.runtimes if r.kind == kind), None)

    # Runs that outlive the agent.

    def recover(self) -> list[PodRun]:
        """recover takes back the runs recorded by an earlier agent on this data directory:
        ended (exit code recorded), adopted (still running) or Lost. Call before launching."""
        found: list[PodRun] = []
        for path, record in self.files.records():
            try:
                if isinstance(record, Exception):
                    raise record
                uid, attempt = record.uid, record.attempt
                run = PodRun(uid, attempt, record.job_id, record.pod_name, Pod(uid, attempt))
                run.pid, run.start_time, run.ports = record.pid, record.start_time, record.ports
                run.runtime = record.runtime
                runtime = self._runtime(run.runtime)
                if runtime is None:
                    raise ValueError(f"this agent has no {run.runtime} runtime")
                kill_reason = self.files.kill_reason(uid, attempt)
                taken = runtime.adopt(run.key, record.body, self.files.exit_path(uid, attempt))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                log.warning("unreadable run record", path=str(path), error=str(exc))
                continue
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
                None if running else self.files.recorded_end(run.uid, run.attempt),
            )
            self._runs[(run.uid, run.attempt)] = run
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
            left = self.mps_daemons.adopt([r.key for r in found if not r.ended.is_set()])
            if left:
                self._spawn_task(self.mps_daemons.sweep(left), "MPS daemons left behind")
        if self.processes.cgroups is not None:  # empty ones of pods that ended unwatched
            self.processes.cgroups.sweep({r.key for r in found if not r.ended.is_set()})
        return found

    async def _follow(self, run: PodRun, runtime: Runtime) -> None:
        """_follow waits for a run's end and settles it."""
        ending = await runtime.wait(run.key)
        await self._release_share(run)
        self._exited(run, ending)

    def _exited(self, run: PodRun, ending: Ending) -> None:
        ended = self.files.recorded_end(run.uid, run.attempt)
        exited = Exited(run.uid, run.attempt, ending.code, ended, ending.oom, ending.reason)
        self._do(self.states.handle(exited))

    # Carrying out the state machine's instructions.

    def _do(self, instructions: list[Instruction]) -> None:
        """_do carries out what the state machine says, in its order."""
        for instruction in instructions:
            match instruction:
                case Start(uid, attempt, order):
                    assert order is not None, "an order to start comes with the order"
                    self._start(uid, attempt, order)
                case Stop(uid, attempt, grace_s, reason):
                    if (run := self._runs.get((uid, attempt))) is not None:
                        self._stop(run, grace_s, reason)
                case Report(uid, attempt):
                    if (run := self._runs.get((uid, attempt))) is not None:
                        self.on_change(run)
                case Settle(uid, attempt):
                    if (run := self._runs.get((uid, attempt))) is not None:
                        self._settle(run)
                case RemoveScratch(uid):
                    shutil.rmtree(self.files.scratch_dir(uid), ignore_errors=True)
                case Unrecord(uid, attempt):
                    self._let_go(uid)
                    self.files.unrecord(uid)

    def _let_go(self, uid: str) -> None:
        """_let_go drops the runs of pod `uid` the state machine no longer knows."""
        for key in [k for k in self._runs if k[0] == uid]:
            if self.states.find(*key) is None:
                del self._runs[key]

    def _start(self, uid: str, attempt: int, order: LaunchOrder) -> None:
        run = PodRun(uid, attempt, order.job_id, order.pod_name, self.states.pods[uid])
        self._runs[(uid, attempt)] = run
        self._let_go(uid)  # an ended attempt this one replaced
        self._spawn_task(self._run(run, order), f"pod {uid}")

    def _spawn_task(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # Orders.

    def launch(self, order: LaunchOrder) -> None:
        self._do(self.states.handle(Ordered(order.uid, order.attempt, order.grace_s, order)))

    def kill(self, order: KillOrder) -> None:
        kill = KillOrdered(order.uid, order.attempt, order.grace_s, order.remove_scratch)
        self._do(self.states.handle(kill))

    def forget(self, uid: str) -> None:
        self._do(self.states.handle(Forgotten(uid)))

    def purge(self, job_id: str) -> None:
        """purge removes a deleted job's logs and scratch directories; never those of a job
        with a pod still running here (its run records keep it adoptable)."""
        runs = self.runs
        if any(r.job_id == job_id and not r.ended.is_set() for r in runs.values()):
            log.warning("purge refused: the job still runs here", job=job_id)
            return
        for uid in [u for u, r in runs.items() if r.job_id == job_id and r.ended.is_set()]:
            self._do(self.states.handle(Forgotten(uid)))
        if self.packages is not None:
            self.packages.release(job_id)
        self.files.remove_job(job_id)

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

    async def _run(self, run: PodRun, order: LaunchOrder) -> None:
        log_path = self.files.log_path(run.uid, run.attempt)
        runtime: Runtime | None = self.processes
        if order.image:
            runtime = self.containers
            run.runtime = runtime.kind if runtime is not None else "container"
        try:
            launch, held = self._launch(run, order, log_path, container=bool(order.image))
            if runtime is None:
                raise StartError(125, "NoContainerRuntime: this node cannot run images")
            if order.package is not None:
                await self._unpack(order, launch)
            if held is not None and self.mps_daemons is not None:
                await self.mps_daemons.hold(held, launch.user)
            started = await runtime.start(launch)
        except (OSError, StartError) as exc:
            await self._release_share(run)
            failure = exc if isinstance(exc, StartError) else StartError(126, f"StartError: {exc}")
            if not run.kill_requested:  # stopped while it started: nothing to tell
                why = failure.reason.partition(": ")[2] if cannot_start(failure.reason) else ""
                why = why or f"cannot start {list(order.command)}: {exc}"
                self.files.note_in_log(log_path, f"arranger: {why}")
            self._exited(run, Ending(failure.code, reason=failure.reason))
            return
        run.pid, run.start_time = started.pid, time.time()
        try:
            record = {**started.record, "exec": exec_record(launch)}  # see exec_session
            self.files.record(run, started.started_at, record)
        except OSError as exc:  # unrecorded, it must not run: no next agent could find it
            runtime.begin(run.key, go=False)
            await runtime.wait(run.key)
            await self._release_share(run)
            self.files.note_in_log(log_path, f"arranger: cannot record the run: {exc}")
            self._exited(run, Ending(126, reason=f"StartError: cannot record the run: {exc}"))
            return
        runtime.begin(run.key, go=not run.kill_requested)
        self._cap_log(run)
        probe = None
        ready = not (order.readiness_port and order.readiness_port in run.ports)
        self._do(self.states.handle(Started(run.uid, run.attempt, run.start_time, ready)))
        if not ready:
            probe = asyncio.create_task(self._probe(run, run.ports[order.readiness_port]))
        ending = await runtime.wait(run.key)
        if probe is not None:
            probe.cancel()
        await self._release_share(run)
        self._exited(run, ending)

    async def _release_share(self, run: PodRun) -> None:
        """_release_share stops the run's MPS daemon, once its program has ended."""
        if self.mps_daemons is not None:
            await self.mps_daemons.stop(run.key)

    def _launch(
        self, run: PodRun, order: LaunchOrder, log_path: Path, container: bool
    ) -> tuple[PodLaunch, HeldShare | None]:
        """_launch prepares a run's account, directories, log, ports and environment, and
        says what GPU share is to be held (see runs on who may read what)."""
        self.files.pod_dir(run.uid, log_path.parent, PASSABLE)
        log_fd = process.log_fd(log_path)  # first, to tell why if it cannot start
        try:
            os.fchmod(log_fd, PRIVATE_FILE)
            user = self.accounts.for_pod(order.owner)
            owner = (user.uid, user.gid) if user is not None and os.geteuid() == 0 else None
            if owner is not None:
                os.fchown(log_fd, *owner)
        finally:
            os.close(log_fd)
        scratch = self.files.scratch_dir(run.uid)
        self.files.pod_dir(run.uid, scratch, PRIVATE, owner)
        run.ports = self.ports.allocate(dict(order.ports))
        held = self.mps_daemons.share_of(run.key, order, user) if self.mps_daemons else None
        env = pod_environment(
            self.environment, order, run.ports, scratch, container=container, user=user, held=held
        )
        launch = PodLaunch(
            key=run.key,
            argv=[*order.command, *order.args],
            env=env,
            cwd=pod_cwd(order, scratch, container),
            scratch=scratch,
            log_path=log_path,
            exit_file=self.files.exit_path(run.uid, run.attempt),
            order=order,
            user=user,
        )
        return launch, held

    async def _unpack(self, order: LaunchOrder, launch: PodLaunch) -> None:
        """_unpack gives the pod its own copy of its job's package (see packages), unpacked as
        the pod's processes start and within their limits, whatever runtime runs the pod."""
        if self.packages is None:
            raise StartError(126, "PackageUnavailable: this agent cannot fetch packages")
        assert order.package is not None
        unpacker = self.packages.unpacker_for(launch, self.processes)
        await self.packages.unpack_into(
            order.package, launch.scratch, launch.user, order.job_id, unpacker
        )

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
        if self.max_log_bytes > 0:
            path = self.files.log_path(run.uid, run.attempt)
            keep = logcap.keep_within(path, self.max_log_bytes, run.ended, run.uid)
            self._spawn_task(keep, f"log of {run.uid}")

    def _stop(self, run: PodRun, grace_s: float, reason: str) -> None:
        if run.pid:  # an agent started again must know it too (again: it may have started since)
            self.files.mark_killed(run.uid, run.attempt, reason)
        runtime = self._runtime(run.runtime)
        if runtime is not None:  # a run still starting may be stopped too (a long pull)
            runtime.stop(run.key, grace_s)

    def _settle(self, run: PodRun) -> None:
        """_settle frees what an ended run held and reports its end."""
        self._let_go(run.uid)  # a replaced attempt: the state machine has let it go
        self.ports.release(run.ports)
        if run.pod.remove_scratch:
            shutil.rmtree(self.files.scratch_dir(run.uid), ignore_errors=True)
        run.ended.set()
        log.info(
            "pod ended", pod=run.uid, attempt=run.attempt, state=run.state.value, reason=run.reason
        )
        self.on_change(run)
