"""mps runs the NVIDIA MPS control daemons that hold pods to their GPU shares: one per account,
GPU and share size (a group), started for the first pod of its group before that pod's program
runs and stopped once the group's last pod has ended (what each is told, and why by group: see
shares).

`start` makes the daemon's directories under `<data dir>/mps/` (the daemon's own, PASSABLE and
the agent's; its `pipe` and `log`, the pod's account's alone, since the MPS server runs as the
client's user and must write there: Bottlerocket found a server unable to reach its pipe
directory exits at once, bottlerocket-os/bottlerocket#4673). A root agent runs the daemon, and
every command it sends it, as the pod's account (setpriv): root never writes into directories
that account may fill with links. That account can then speak to its own daemon too, as it can
leave MPS by dropping CUDA_MPS_PIPE_DIRECTORY: the limits hold a pod's ordinary programs
(frameworks that take what they find), not one bent on escaping them. It runs `nvidia-cuda-mps-control -d`
in the daemon's environment, reads its pid from the file it writes in its pipe directory,
records it (pid, the process's start time and the runs it holds, in the agent's `daemon.json`,
replaced whole as runs join and leave), then sends each command on the daemon's control pipe:
the control program reads it on stdin, as `echo COMMAND | nvidia-cuda-mps-control` does. Any
step that fails stops the daemon and fails the pod's start: a pod is never run as held while
it is not. A later pod of the group joins the running daemon (recorded before its program
runs). Starts and ends of one group are serialised.

`stop`, once a pod's run has ended: the run leaves its group; the group's last run gone, `quit`
on the control pipe, the process killed if it is still there after QUIT_GRACE_S (by its
recorded pid and start time, never by what the pod's pipe directory says), its directory
removed. A daemon gone while its pods run (killed, crashed) is noticed when the node says
whether it enforces shares (`enforcing`, each heartbeat): from then the node's shares are not
enforced, said once in the log, until the group's runs have all ended or a pod of the group
starting (one restarting in place: the scheduler sends no new share to the node meanwhile)
starts the daemon again in its place (the group's running pods' new CUDA processes are then
held again). On a real GPU the daemon's server goes with it, and the CUDA calls of the
pods it served fail (cudaErrorMpsRpcFailure); the agent kills no pod for it. `adopt`, as the
agent starts again: the daemons of runs still running are followed again; every other one in
the directory (left by an agent that died) is stopped by `sweep`. A daemon an earlier release
made for one run (its record names the run, not a group) is followed as a group of that run.

One daemon's identity, its record and the control program run as an account are mps_daemon's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from pathlib import Path

import psutil
import structlog

from arranger.agent.config import PodUser
from arranger.agent.datadir import PASSABLE, PRIVATE, make_dir, make_dirs
from arranger.agent.discovery import GpuDevice
from arranger.agent.launcher import root_env, which
from arranger.agent.mps_daemon import (
    Daemon,
    MpsError,
    dir_owner,
    read_record,
    run_control,
    write_record,
)
from arranger.agent.orders import LaunchOrder
from arranger.agent.runtime import StartError
from arranger.agent.shares import PID_FILE, HeldShare, daemon_home, held_share

log = structlog.get_logger("arranger.agent")

QUIT_GRACE_S = 5.0  # after `quit`, before the daemon is killed


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
    """MpsDaemons: the MPS control daemons of this node's pods, by group, and the runs each
    holds. `enforcing` is False while any of them is gone with runs of its group running."""

    def __init__(self, control: str, data_dir: Path, gpus: Mapping[int, GpuDevice]) -> None:
        self.control = control
        self.data_dir = data_dir
        self.top = data_dir / "mps"
        self.gpus = dict(gpus)
        self.daemons: dict[str, Daemon] = {}  # by group
        self.runs: dict[str, set[str]] = {}  # group -> the runs it holds
        self._group_of: dict[str, str] = {}  # run -> group
        # daemon directory -> its lock and how many hold or wait for it: the starts, stops and
        # sweeps of one directory go in turn; a lock goes when no one needs it
        self._locks: dict[Path, tuple[asyncio.Lock, int]] = {}
        self._lost: set[str] = set()  # groups whose daemon is gone, until back or ended
        # A root agent runs each daemon, and every command to it, as the pod's account:
        # nothing of root's touches the directories that account writes.
        self.setpriv = which("setpriv") if os.geteuid() == 0 else None

    def share_of(self, key: str, order: LaunchOrder, user: PodUser | None) -> HeldShare | None:
        """share_of: what run `key` of `order`, run as `user`, is held to (see
        shares.held_share), or None: pods with whole GPUs run as they would without MPS. A
        container given a share is refused (StartError): its MPS directories and shared
        memory are not brought into it, so it would run unheld on a node that says it holds
        shares, beside pods that trust it."""
        grants = [(g.index, g.share) for g in order.gpus]
        root = os.geteuid() == 0
        account = user.uid if user is not None and root else os.geteuid()
        held = held_share(key, grants, self.gpus, self.top, account)
        if held is not None and order.image:
            raise StartError(
                126,
                "StartError: this node holds GPU shares with MPS, which holds plain processes "
                "only: a container may have whole GPUs here, not a share",
            )
        return held

    async def hold(self, held: HeldShare, user: PodUser | None) -> None:
        """hold has the daemon of `held`'s group hold a plain process to its share, before its
        program runs, owned by the pod's account `user` where the agent is root; a pod it
        cannot hold does not start (StartError)."""
        owner = (user.uid, user.gid) if user is not None and os.geteuid() == 0 else None
        try:
            await self.start(held, owner)
        except MpsError as exc:
            why = f"StartError: cannot hold the GPU share with MPS: {exc}"
            raise StartError(126, why) from None

    async def start(self, held: HeldShare, owner: tuple[int, int] | None) -> None:
        """start adds run `held.key` to its group's daemon: the running one, or one started
        now and told its limits (in place of one found gone); raises MpsError (having stopped
        what it started) when it cannot. `owner`: who gets its pipe and log."""
        group = held.group
        async with self._serial(held.home):
            daemon = self.daemons.get(group)
            if daemon is None or not daemon.alive():
                if daemon is not None:
                    log.warning("MPS daemon gone: starting it again", group=group, pid=daemon.pid)
                    await self._end(daemon)
                try:
                    started = await self._begin(held, owner)
                except MpsError:
                    if daemon is not None and self.runs.get(group):
                        self._keep_record(daemon)  # the next agent must know it is gone too
                    raise
                self.daemons[group] = started  # a failed start again leaves the lost one
                if group in self._lost:
                    self._lost.discard(group)
                    log.info("MPS daemon back: its group's new CUDA processes are held again")
                daemon = started
            self.runs.setdefault(group, set()).add(held.key)
            self._group_of[held.key] = group
            self._record(daemon)
        log.info(
            "MPS daemon holds the pod's GPU share",
            run=held.key,
            group=group,
            pid=daemon.pid,
            runs=len(self.runs[group]),
            gpu=held.gpu_index,
            memory_bytes=held.memory_bytes,
            threads=held.thread_percentage,
        )

    async def _begin(self, held: HeldShare, owner: tuple[int, int] | None) -> Daemon:
        """_begin runs a fresh daemon for `held`'s group and tells it the limits."""
        if not held.socket_fits():
            raise MpsError(f"its control socket's path would be too long: {held.pipe_dir}")
        home = held.home
        shutil.rmtree(home, ignore_errors=True)  # an earlier start's that failed half-way
        make_dirs(self.data_dir, Path("mps", home.name), PASSABLE)
        make_dir(held.pipe_dir, PRIVATE, owner)
        make_dir(held.log_dir, PRIVATE, owner)
        env = root_env(**held.daemon_env())
        daemon = Daemon(held.group, home, owner=owner)
        try:
            code, said = await run_control(
                self.control, self.setpriv, ["-d"], env, None, home / "daemon.out", owner
            )
            if code != 0:
                raise MpsError(f"{self.control} -d exited {code}: {said}")
            daemon = self._started(held, owner)
            for command in held.commands():
                code, said = await run_control(
                    self.control, self.setpriv, [], env, command, owner=owner
                )
                if code != 0:
                    raise MpsError(f"{command!r} failed ({code}): {said}")
        except BaseException:
            await self._end(daemon)
            raise
        return daemon

    def _started(self, held: HeldShare, owner: tuple[int, int] | None) -> Daemon:
        """_started: the daemon as its pid file says (read before the pod runs, so the pod has
        not touched it)."""
        try:
            pid = int((held.pipe_dir / PID_FILE).read_text().strip())
            started_at = psutil.Process(pid).create_time()
        except (OSError, ValueError, psutil.Error) as exc:
            raise MpsError(f"no daemon to be found by {held.pipe_dir / PID_FILE}: {exc}") from None
        return Daemon(held.group, held.home, pid, started_at, owner)

    def _record(self, daemon: Daemon) -> None:
        """_record writes the daemon's record with the runs its group holds (see mps_daemon)."""
        write_record(daemon, self.runs.get(daemon.key, ()))

    async def stop(self, key: str) -> None:
        """stop takes run `key` out of its group, ending the daemon once the group's last run
        has gone; never raises."""
        group = self._group_of.pop(key, None)
        if group is None:
            return
        async with self._serial(daemon_home(self.top, group)):
            runs = self.runs.get(group, set())
            runs.discard(key)
            daemon = self.daemons.get(group)
            if runs:
                if daemon is not None and daemon.home.is_dir():
                    with contextlib.suppress(OSError):
                        self._record(daemon)
                return
            self.runs.pop(group, None)
            self.daemons.pop(group, None)
            if group in self._lost:
                self._lost.discard(group)
                if not self._lost:
                    log.info("GPU shares are enforced again: no pod runs without its MPS daemon")
            if daemon is not None:
                await self._end(daemon)

    def enforcing(self) -> bool:
        """enforcing: every group's daemon is there. A daemon found gone is said once."""
        for group, daemon in self.daemons.items():
            if group not in self._lost and not daemon.alive():
                self._lost.add(group)
                log.warning(
                    "GPU shares are not enforced on this node: an MPS daemon is gone; its pods "
                    "run on, and no new share should come here until it is back or they end",
                    group=group,
                    runs=sorted(self.runs.get(group, ())),
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
        # A daemon an earlier release made for one run is named by that run.
        by_run = {daemon_home(self.top, key): key for key in running}
        for home in homes:
            daemon, runs = read_record(home)
            if home in by_run and daemon.key in ("", by_run[home]):
                # A run taken back keeps its own daemon, known or not (pid 0: counted as gone).
                daemon = daemon if daemon.key else Daemon(by_run[home], home)
                runs = [by_run[home]]
            held = set(runs) & set(running)
            if not held or not daemon.key:
                left.append(daemon)
                continue
            self.daemons[daemon.key] = daemon
            self.runs[daemon.key] = held
            self._group_of.update(dict.fromkeys(held, daemon.key))
            log.info("MPS daemon of pods taken back", group=daemon.key, runs=sorted(held))
        return left

    async def sweep(self, left: Sequence[Daemon]) -> None:
        """sweep stops the daemons an earlier agent left behind; never raises."""
        for daemon in left:
            log.info("stopping an MPS daemon left behind", run=daemon.key, home=str(daemon.home))
            async with self._serial(daemon.home):  # not while a pod of its group starts there
                if read_record(daemon.home)[0].pid == daemon.pid:
                    await self._end(daemon)
                elif daemon.alive():  # a pod of its group took the directory: the process alone
                    log.info("MPS daemon left behind killed", run=daemon.key, pid=daemon.pid)
                    with contextlib.suppress(OSError):
                        os.kill(daemon.pid, signal.SIGKILL)

    @contextlib.asynccontextmanager
    async def _serial(self, home: Path) -> AsyncIterator[None]:
        """_serial: one start, stop or sweep at a time in a daemon's directory."""
        lock, users = self._locks.get(home, (asyncio.Lock(), 0))
        self._locks[home] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[home]
            if users > 1:
                self._locks[home] = (lock, users - 1)
            else:
                del self._locks[home]

    def _keep_record(self, daemon: Daemon) -> None:
        """_keep_record: the record of a daemon found gone whose group's pods still run, kept
        (its directory made again where a failed start removed it) for the next agent."""
        with contextlib.suppress(OSError):
            make_dirs(self.data_dir, Path("mps", daemon.home.name), PASSABLE)
            self._record(daemon)

    async def _end(self, daemon: Daemon) -> None:
        """_end: `quit` on the daemon's pipe, the process killed if it outlives QUIT_GRACE_S,
        its directory removed. Errors are logged, never raised."""
        home = daemon.home
        pipes = {
            "CUDA_MPS_PIPE_DIRECTORY": str(home / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(home / "log"),
        }
        owner = daemon.owner
        if owner is None and os.geteuid() == 0:  # no record says: the pipe's own account
            owner = dir_owner(home / "pipe")
        try:
            if dir_owner(home / "pipe") is not None:  # a directory, never through a link
                code, said = await run_control(
                    self.control, self.setpriv, [], root_env(**pipes), "quit", owner=owner
                )
                if code != 0 and daemon.alive():
                    log.warning("MPS daemon did not take quit", run=daemon.key, said=said)
            if not await asyncio.to_thread(daemon.gone_within, QUIT_GRACE_S):
                log.warning("MPS daemon killed: it outlived quit", run=daemon.key, pid=daemon.pid)
                os.kill(daemon.pid, signal.SIGKILL)
        except (OSError, MpsError) as exc:
            log.warning("cannot stop an MPS daemon", run=daemon.key, error=str(exc))
        shutil.rmtree(home, ignore_errors=True)
