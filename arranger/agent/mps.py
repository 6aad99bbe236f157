"""mps runs the NVIDIA MPS control daemons that hold pods to their GPU shares: one per pod attempt
that holds a share, made for it before its program runs (what each is told, and why one per
pod: see shares).

`start` makes the daemon's directories under `<data dir>/mps/` (the daemon's own, PASSABLE and
the agent's; its `pipe` and `log`, the pod's account's alone, since the MPS server runs as the
client's user and must write there: Bottlerocket found a server unable to reach its pipe
directory exits at once, bottlerocket-os/bottlerocket#4673). A root agent runs the daemon, and
every command it sends it, as the pod's account (setpriv): root never writes into directories
that account may fill with links. That account can then speak to its own daemon too, as it can
leave MPS by dropping CUDA_MPS_PIPE_DIRECTORY: the limits hold a pod's ordinary programs
(frameworks that take what they find), not one bent on escaping them. It runs `nvidia-cuda-mps-control -d`
in the daemon's environment, reads its pid from the file it writes in its pipe directory,
records it (pid and the process's start time, in the agent's `daemon.json`), then sends each
command on the daemon's control pipe: the control program reads it on stdin, as
`echo COMMAND | nvidia-cuda-mps-control` does. Any step that fails stops the daemon and fails
the pod's start: a pod is never run as held while it is not.

`stop`, once the pod's run has ended: `quit` on the control pipe, the process killed if it is
still there after QUIT_GRACE_S (by its recorded pid and start time, never by what the pod's
pipe directory says), its directory removed. A daemon gone while its pod runs (killed, crashed)
is noticed when the node says whether it enforces shares (`enforcing`, each heartbeat): from
then until that run ends the node's shares are not enforced, said once in the log; the pod
itself runs on (its CUDA calls fail or not, as MPS makes them). `adopt`, as the agent starts
again: the daemons of runs still running are followed again; every other one in the directory
(left by an agent that died) is stopped by `sweep`.

Programs are started as subprocess starts them (close_fds, a new session, no preexec_fn), so
no Python code runs in a fork of the agent and its gRPC threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
import structlog

from arranger.agent import process
from arranger.agent.config import PodUser
from arranger.agent.datadir import PASSABLE, PRIVATE, make_dir, make_dirs
from arranger.agent.discovery import GpuDevice
from arranger.agent.launcher import root_env, which
from arranger.agent.orders import LaunchOrder
from arranger.agent.runtime import StartError
from arranger.agent.shares import PID_FILE, HeldShare, daemon_home, held_share

log = structlog.get_logger("arranger.agent")

COMMAND_TIMEOUT_S = 10.0  # one run of the control program (-d, or one command)
QUIT_GRACE_S = 5.0  # after `quit`, before the daemon is killed
RECORD = "daemon.json"


class MpsError(Exception):
    """MpsError: a daemon could not be started or told its limits; the message says why."""


@dataclass(frozen=True)
class Daemon:
    """Daemon: one run's control daemon, by its directory, pid and the process's start time
    (pid 0: unknown, as for a daemon whose start no record kept)."""

    key: str
    home: Path
    pid: int = 0
    started_at: float = 0.0
    owner: tuple[int, int] | None = None  # the account it runs as (None: the agent's)

    def alive(self) -> bool:
        """alive: the recorded process still runs (not a zombie, not a reused pid)."""
        if self.pid <= 0:
            return False
        try:
            proc = psutil.Process(self.pid)
            return (
                abs(proc.create_time() - self.started_at) < 0.05
                and proc.status() != psutil.STATUS_ZOMBIE
            )
        except psutil.Error:
            return False


def find_daemons(
    sharing: str, control: str, data_dir: Path, gpus: Sequence[GpuDevice]
) -> tuple[MpsDaemons | None, str]:
    """find_daemons: the daemons that enforce shares on this node, or None and why not: enforcement is
    not configured, the control program is not there, or the GPUs are not real."""
    if sharing != "mps":
        return None, "not configured (gpuSharing: mps)"
    path = control if os.sep in control else shutil.which(control)
    if path is None or not os.access(path, os.X_OK):
        return None, f"{control} not found or not executable"
    if not gpus or any(gpu.fake for gpu in gpus):
        return None, "the GPUs here are not real ones"
    return MpsDaemons(path, data_dir, {gpu.index: gpu for gpu in gpus}), ""


class MpsDaemons:
    """MpsDaemons: the MPS control daemons of this node's pods, by run key. `enforcing` is
    False while any of them is gone and its run not yet ended."""

    def __init__(self, control: str, data_dir: Path, gpus: Mapping[int, GpuDevice]) -> None:
        self.control = control
        self.data_dir = data_dir
        self.top = data_dir / "mps"
        self.gpus = dict(gpus)
        self.daemons: dict[str, Daemon] = {}
        self._lost: set[str] = set()  # runs whose daemon is gone, until they end
        # A root agent runs each daemon, and every command to it, as the pod's account:
        # nothing of root's touches the directories that account writes.
        self.setpriv = which("setpriv") if os.geteuid() == 0 else None

    def share_of(self, key: str, order: LaunchOrder) -> HeldShare | None:
        """share_of: what run `key` of `order` is held to (see shares.held_share), or None.
        Pods with whole GPUs, and containers (their MPS directories are not mounted in yet),
        run as they would without MPS."""
        grants = [(g.index, g.share) for g in order.gpus]
        held = held_share(key, grants, self.gpus, self.top)
        if held is not None and order.image:
            log.warning("a container's GPU share is not held by MPS", pod=key)
            return None
        return held

    async def hold(self, held: HeldShare, user: PodUser | None) -> None:
        """hold starts the daemon that holds a plain process to its share, before its program
        runs, owned by the pod's account `user` where the agent is root; a pod it cannot hold
        does not start (StartError)."""
        owner = (user.uid, user.gid) if user is not None and os.geteuid() == 0 else None
        try:
            await self.start(held, owner)
        except MpsError as exc:
            why = f"StartError: cannot hold the GPU share with MPS: {exc}"
            raise StartError(126, why) from None

    async def start(self, held: HeldShare, owner: tuple[int, int] | None) -> None:
        """start runs the daemon of `held` and sets its limits; raises MpsError (having
        stopped what it started) when it cannot. `owner`: who gets its pipe and log."""
        if not held.socket_fits():
            raise MpsError(f"its control socket's path would be too long: {held.pipe_dir}")
        home = held.home
        shutil.rmtree(home, ignore_errors=True)  # an earlier start's that failed half-way
        make_dirs(self.data_dir, Path("mps", home.name), PASSABLE)
        make_dir(held.pipe_dir, PRIVATE, owner)
        make_dir(held.log_dir, PRIVATE, owner)
        env = root_env(**held.daemon_env())
        daemon = Daemon(held.key, home, owner=owner)
        try:
            code, said = await self._run(["-d"], env, None, home / "daemon.out", owner)
            if code != 0:
                raise MpsError(f"{self.control} -d exited {code}: {said}")
            daemon = self._started(held, owner)
            for command in held.commands():
                code, said = await self._run([], env, command, owner=owner)
                if code != 0:
                    raise MpsError(f"{command!r} failed ({code}): {said}")
        except BaseException:
            await self._end(daemon)
            raise
        self.daemons[held.key] = daemon
        log.info(
            "MPS daemon holds the pod's GPU share",
            run=held.key,
            pid=daemon.pid,
            gpu=held.gpu_index,
            memory_bytes=held.memory_bytes,
            threads=held.thread_percentage,
        )

    def _started(self, held: HeldShare, owner: tuple[int, int] | None) -> Daemon:
        """_started: the daemon as its pid file says (read before the pod runs, so the pod has
        not touched it), recorded for the next agent."""
        try:
            pid = int((held.pipe_dir / PID_FILE).read_text().strip())
            started_at = psutil.Process(pid).create_time()
        except (OSError, ValueError, psutil.Error) as exc:
            raise MpsError(f"no daemon to be found by {held.pipe_dir / PID_FILE}: {exc}") from None
        daemon = Daemon(held.key, held.home, pid, started_at, owner)
        fd = process.open_private(held.home / RECORD)
        with os.fdopen(fd, "w") as f:
            json.dump(
                {
                    "key": held.key,
                    "pid": pid,
                    "started_at": started_at,
                    "owner": list(owner) if owner else None,
                },
                f,
            )
        return daemon

    async def stop(self, key: str) -> None:
        """stop ends run `key`'s daemon, if it has one; never raises."""
        daemon = self.daemons.pop(key, None)
        if daemon is None:
            return
        if key in self._lost:
            self._lost.discard(key)
            if not self._lost:
                log.info("GPU shares are enforced again: no pod runs without its MPS daemon")
        await self._end(daemon)

    def enforcing(self) -> bool:
        """enforcing: every running pod's daemon is there. A daemon found gone is said once."""
        for key, daemon in self.daemons.items():
            if key not in self._lost and not daemon.alive():
                self._lost.add(key)
                log.warning(
                    "GPU shares are not enforced on this node: a pod's MPS daemon is gone; "
                    "the pod runs on, and no new share should come here until it ends",
                    run=key,
                    pid=daemon.pid,
                )
        return not self._lost

    def adopt(self, running: Collection[str]) -> list[Daemon]:
        """adopt follows again the daemons of the runs in `running` (taken back still running)
        and returns every other daemon left in the directory, for `sweep`."""
        left: list[Daemon] = []
        homes: list[Path] = []
        with contextlib.suppress(FileNotFoundError), os.scandir(self.top) as entries:
            homes = sorted(Path(e.path) for e in entries if e.is_dir(follow_symlinks=False))
        runs = {daemon_home(self.top, key): key for key in running}
        for home in homes:
            daemon = _recorded(home)
            key = runs.get(home)
            if key is None:
                left.append(daemon)
                continue
            # A run taken back keeps its daemon, known or not (pid 0: counted as gone).
            self.daemons[key] = daemon if daemon.key == key else Daemon(key, home)
            log.info("MPS daemon of a pod taken back", run=key, pid=self.daemons[key].pid)
        return left

    async def sweep(self, left: Sequence[Daemon]) -> None:
        """sweep stops the daemons an earlier agent left behind; never raises."""
        for daemon in left:
            log.info("stopping an MPS daemon left behind", run=daemon.key, home=str(daemon.home))
            await self._end(daemon)

    async def _end(self, daemon: Daemon) -> None:
        """_end: `quit` on the daemon's pipe, the process killed if it outlives QUIT_GRACE_S,
        its directory removed. Errors are logged, never raised."""
        home = daemon.home
        pipes = {
            "CUDA_MPS_PIPE_DIRECTORY": str(home / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(home / "log"),
        }
        try:
            if (home / "pipe").is_dir():
                code, said = await self._run([], root_env(**pipes), "quit", owner=daemon.owner)
                if code != 0 and daemon.alive():
                    log.warning("MPS daemon did not take quit", run=daemon.key, said=said)
            if not await asyncio.to_thread(_gone_within, daemon, QUIT_GRACE_S):
                log.warning("MPS daemon killed: it outlived quit", run=daemon.key, pid=daemon.pid)
                os.kill(daemon.pid, signal.SIGKILL)
        except (OSError, MpsError) as exc:
            log.warning("cannot stop an MPS daemon", run=daemon.key, error=str(exc))
        shutil.rmtree(home, ignore_errors=True)

    async def _run(
        self,
        args: list[str],
        env: Mapping[str, str],
        command: str | None,
        output: Path | None = None,
        owner: tuple[int, int] | None = None,
    ) -> tuple[int, str]:
        """_run runs the control program once, as `owner` where the agent is root (through
        setpriv: no fork of the agent switches user): with `command` on its stdin (its answer
        returned), or (None) with its output going to `output` (a daemonising run, whose
        daemon may keep what it was given open). Raises MpsError past COMMAND_TIMEOUT_S."""
        argv = [self.control, *args]
        if owner is not None and os.geteuid() == 0 and owner[0] != 0:
            if self.setpriv is None:
                raise MpsError("setpriv not found: the daemon would run as root")
            uid, gid = owner
            argv = [self.setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *argv]
        out_fd = process.open_private(output) if output is not None else subprocess.PIPE
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                env=dict(env),
                cwd="/",
                close_fds=True,
                start_new_session=True,
                stdout=out_fd,
                stderr=subprocess.STDOUT,
                stdin=subprocess.PIPE if command is not None else subprocess.DEVNULL,
            )
        finally:
            if output is not None:
                os.close(out_fd)
        try:
            async with asyncio.timeout(COMMAND_TIMEOUT_S):
                data = command.encode() + b"\n" if command is not None else None
                said, _ = await proc.communicate(data)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            took = f"{self.control} {' '.join(args)} took over {COMMAND_TIMEOUT_S} s"
            raise MpsError(took) from None
        text = (said or b"").decode(errors="replace").strip()
        if output is not None:
            with contextlib.suppress(OSError):
                text = (await asyncio.to_thread(output.read_bytes)).decode(errors="replace")
        return proc.returncode or 0, text.strip()[-500:]


def _gone_within(daemon: Daemon, timeout_s: float) -> bool:
    """_gone_within: whether the daemon's process has ended within timeout_s (a thread's
    wait: an exited daemon is no child of the agent's to be awaited)."""
    deadline = time.monotonic() + timeout_s
    while daemon.alive():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _recorded(home: Path) -> Daemon:
    """_recorded: the daemon a directory's record names (key "" and pid 0 where none is
    readable: one whose start an agent did not live to record)."""
    try:
        body = json.loads((home / RECORD).read_text())
        owner = body.get("owner")
        return Daemon(
            str(body["key"]),
            home,
            int(body["pid"]),
            float(body["started_at"]),
            (int(owner[0]), int(owner[1])) if owner else None,
        )
    except (OSError, ValueError, KeyError, TypeError):
        return Daemon("", home)
