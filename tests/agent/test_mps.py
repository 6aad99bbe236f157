"""GPU shares held by MPS daemons the agent runs, one per account, GPU and share: real supervisor,
shims and pod processes, and a stand-in nvidia-cuda-mps-control (mps_standin.py) that records
what each daemon is told. A pod here "asks its daemon" for its limits over the daemon's control
socket, as a CUDA client gets them from its server: what it is held to is the daemon's, set by
the agent before the pod's program ran, whatever the pod's own environment says."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from structlog.testing import capture_logs

from arranger.agent import mps
from arranger.agent.agent import Agent
from arranger.agent.config import AgentConfig, AgentConfigError, load_agent_config
from arranger.agent.discovery import Capacity, GpuDevice
from arranger.agent.mps import MpsDaemons, MpsError, find_daemons
from arranger.agent.mps_daemon import run_control
from arranger.agent.orders import GpuGrant, LaunchOrder
from arranger.agent.runs import PodRun
from arranger.agent.shares import HeldShare, daemon_home, share_group
from arranger.agent.supervisor import Supervisor
from arranger.states import PodState
from arranger.v1 import agent_pb2
from tests.agent.rootagent import local_users, shared_dir
from tests.conftest import Gate, eventually, script

GI = 2**30
GPU = GpuDevice(0, "GPU-aaaa", "H200", 8 * GI)
STANDIN = Path(__file__).with_name("mps_standin.py")

# A pod's program: prints its environment and what its daemon says its limits are (after
# raising its own MPS variables, with "raise"), then waits at the gate on port argv[2], if any.
CLIENT = """
import json, os, socket, sys
if sys.argv[1] == "raise":  # more than its share, as a program may ask
    os.environ.update(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="100",
                      CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=1000G")
said = []
if "CUDA_MPS_PIPE_DIRECTORY" in os.environ:
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.path.join(os.environ["CUDA_MPS_PIPE_DIRECTORY"], "control"))
    dev = os.environ["CUDA_VISIBLE_DEVICES"]
    s.sendall(("get_default_active_thread_percentage\\n"
               f"get_default_device_pinned_mem_limit {dev}\\n").encode())
    s.shutdown(socket.SHUT_WR)
    data = b""
    while chunk := s.recv(4096):
        data += chunk
    said = data.decode().split()
print("POD " + json.dumps({"env": dict(os.environ), "said": said}), flush=True)
if len(sys.argv) > 2:
    socket.create_connection(("127.0.0.1", int(sys.argv[2]))).recv(1)
"""


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """data_dir: the agent's data directory, short enough for its daemons' control sockets
    (a Unix socket's path is at most 107 bytes; pytest's tmp_path may be long)."""
    with tempfile.TemporaryDirectory(prefix="mps-", dir="/tmp") as top:
        yield Path(top)


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """standin: a stand-in nvidia-cuda-mps-control and the file it records into; any daemon
    it started that still runs is killed afterwards."""
    control, record = make_standin(tmp_path)
    yield control, record
    for event in events(record):
        if event["event"] == "start":
            try:
                proc = psutil.Process(event["pid"])
                if any("mps_standin" in arg for arg in proc.cmdline()):
                    proc.kill()
            except psutil.Error:
                pass


def make_standin(tmp_path: Path, fail: str = "") -> tuple[str, Path]:
    record = tmp_path / "mps-record.jsonl"
    path = tmp_path / f"bin{fail and '-failing'}" / "nvidia-cuda-mps-control"
    path.parent.mkdir()
    extra = f" MPS_STANDIN_FAIL='{fail}'" if fail else ""
    path.write_text(
        f"#!/bin/sh\nMPS_STANDIN_RECORD='{record}'{extra} "
        f"exec '{sys.executable}' '{STANDIN}' \"$@\"\n"
    )
    path.chmod(0o755)
    return str(path), record


def events(record: Path) -> list[dict[str, Any]]:
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines()]


def told(record: Path, home: Path) -> list[str]:
    """told: every command the daemon of `home` received, in order."""
    pipe = str(home / "pipe")
    return [e["command"] for e in events(record) if e["event"] == "command" and e["pipe"] == pipe]


def group(share: float) -> str:
    """group: the daemon that holds this test's pods (they run as the agent's account)."""
    return share_group(os.geteuid(), GPU, share)


def home_of(data_dir: Path, share: float) -> Path:
    return daemon_home(data_dir / "mps", group(share))


def held(data_dir: Path, control: str, ended: dict[str, PodRun]) -> Supervisor:
    def changed(run: PodRun) -> None:
        if run.ended.is_set():
            ended[run.uid] = run

    daemons = MpsDaemons(control, data_dir, {0: GPU})
    return Supervisor("n1", "127.0.0.1", data_dir, changed, mps=True, mps_daemons=daemons)


def order(uid: str, command: list[str], share: float) -> LaunchOrder:
    job, _, pod = uid.partition("/")
    gpus = (GpuGrant(0, share),)
    return LaunchOrder(uid, 0, job_id=job, pod_name=pod, command=tuple(command), gpus=gpus)


def pod_said(supervisor: Supervisor, uid: str) -> dict[str, Any]:
    for line in supervisor.files.log_path(uid, 0).read_text().splitlines():
        if line.startswith("POD "):
            found: dict[str, Any] = json.loads(line.removeprefix("POD "))
            return found
    raise AssertionError(f"{uid} printed nothing: {supervisor.files.log_path(uid, 0).read_text()}")


async def test_a_shared_pod_runs_under_a_daemon_told_its_limits_first(
    tmp_path: Path, data_dir: Path, standin: tuple[str, Path]
) -> None:
    control, record = standin
    ended: dict[str, PodRun] = {}
    supervisor = held(data_dir, control, ended)
    supervisor.launch(order("j/p", [*script(tmp_path, "client", CLIENT), "plain"], 0.25))
    await eventually(lambda: "j/p" in ended, what="the pod to end")
    assert ended["j/p"].state == PodState.SUCCEEDED, ended["j/p"].reason
    home = home_of(data_dir, 0.25)
    (start,) = [e for e in events(record) if e["event"] == "start"]
    assert start["pipe"] == str(home / "pipe") and start["log"] == str(home / "log")
    assert start["devices"] == "GPU-aaaa"  # the daemon's server sees this GPU alone
    assert told(record, home) == [
        "set_default_device_pinned_mem_limit GPU-aaaa 2048M",  # before the pod asked
        "set_default_active_thread_percentage 25",
        "get_default_active_thread_percentage",  # the pod
        "get_default_device_pinned_mem_limit GPU-aaaa",
        "quit",  # once the pod had ended, before it was reported
    ]
    said = pod_said(supervisor, "j/p")
    assert said["said"] == ["25", "2048M"]
    env = said["env"]
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(home / "pipe")
    assert env["CUDA_MPS_LOG_DIRECTORY"] == str(home / "log")
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-aaaa" and env["ARRANGER_GPU_FRACTION"] == "0.25"
    assert env["ARRANGER_GPU_MEMORY_BYTES"] == str(2 * GI)
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.225"
    assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env and "XLA_PYTHON_CLIENT_PREALLOCATE" not in env
    assert not home.exists() and not supervisor.mps_daemons.daemons  # type: ignore[union-attr]


async def test_pods_of_one_account_and_share_share_a_daemon_another_share_its_own_a_whole_gpu_none(
    tmp_path: Path, data_dir: Path, standin: tuple[str, Path]
) -> None:
    """One account's pods holding the same share of a GPU are held by one daemon (its server
    runs their clients side by side, where two daemons' servers would take turns on the GPU);
    the daemon lives until the last of them ends. Another share size gets its own daemon
    (a daemon's limits bind all its clients), a whole-GPU pod none."""
    control, record = standin
    ended: dict[str, PodRun] = {}
    supervisor = held(data_dir, control, ended)
    client = script(tmp_path, "client", CLIENT)
    async with Gate() as first, Gate() as rest:
        supervisor.launch(order("j/a", [*client, "plain", str(first.port)], 0.5))
        for uid, share in (("j/c", 0.5), ("j/b", 0.25), ("j/w", 1.0)):
            supervisor.launch(order(uid, [*client, "plain", str(rest.port)], share))
        runs = supervisor.runs
        pods = ("j/a", "j/b", "j/c", "j/w")
        await eventually(
            lambda: all(runs[u].state == PodState.RUNNING for u in pods), what="the pods to run"
        )
        daemons = supervisor.mps_daemons
        assert daemons is not None and set(daemons.daemons) == {group(0.5), group(0.25)}
        assert daemons.runs == {group(0.5): {"j/a.0", "j/c.0"}, group(0.25): {"j/b.0"}}
        assert all(d.alive() for d in daemons.daemons.values())  # both at once, one GPU
        recorded = json.loads((home_of(data_dir, 0.5) / "daemon.json").read_text())
        assert recorded["runs"] == ["j/a.0", "j/c.0"]  # for the next agent
        first.open()
        await eventually(lambda: "j/a" in ended, what="j/a to end")
        assert daemons.daemons[group(0.5)].alive() and daemons.runs[group(0.5)] == {"j/c.0"}
        assert "quit" not in told(record, home_of(data_dir, 0.5))  # j/c still runs under it
        rest.open()
        await eventually(lambda: len(ended) == 4, what="the pods to end")
    homes = {share: home_of(data_dir, share) for share in (0.5, 0.25)}
    starts = [e["pipe"] for e in events(record) if e["event"] == "start"]
    assert sorted(starts) == sorted(str(home / "pipe") for home in homes.values())
    assert told(record, homes[0.5])[:2] == [
        "set_default_device_pinned_mem_limit GPU-aaaa 4096M",
        "set_default_active_thread_percentage 50",
    ]
    assert told(record, homes[0.5]).count("quit") == 1 and told(record, homes[0.5])[-1] == "quit"
    assert told(record, homes[0.25])[:2] == [
        "set_default_device_pinned_mem_limit GPU-aaaa 2048M",
        "set_default_active_thread_percentage 25",
    ]
    assert pod_said(supervisor, "j/a")["said"] == ["50", "4096M"]
    assert pod_said(supervisor, "j/c")["said"] == ["50", "4096M"]
    whole = pod_said(supervisor, "j/w")["env"]  # runs as it would without MPS
    assert whole["CUDA_VISIBLE_DEVICES"] == "0" and "CUDA_MPS_PIPE_DIRECTORY" not in whole
    assert not daemons.daemons and not daemons.runs
    assert not any(home.exists() for home in homes.values())


async def test_a_pod_that_raises_its_own_mps_variables_is_still_held_by_its_daemon(
    tmp_path: Path, data_dir: Path, standin: tuple[str, Path]
) -> None:
    control, record = standin
    ended: dict[str, PodRun] = {}
    supervisor = held(data_dir, control, ended)
    supervisor.launch(order("j/p", [*script(tmp_path, "client", CLIENT), "raise"], 0.25))
    await eventually(lambda: "j/p" in ended, what="the pod to end")
    said = pod_said(supervisor, "j/p")
    assert said["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"  # what the pod asked
    assert said["said"] == ["25", "2048M"]  # what its daemon holds it to
    home = home_of(data_dir, 0.25)
    sets = [c for c in told(record, home) if c.startswith("set_")]
    assert sets == [
        "set_default_device_pinned_mem_limit GPU-aaaa 2048M",
        "set_default_active_thread_percentage 25",
    ]


async def test_a_container_given_a_share_is_refused_where_shares_are_held(
    data_dir: Path, standin: tuple[str, Path]
) -> None:
    """A container would run unheld (its MPS directories and shared memory are not brought
    into it) on a node that says it holds shares: it is refused, naming why, and no daemon
    starts for it."""
    control, record = standin
    ended: dict[str, PodRun] = {}
    supervisor = held(data_dir, control, ended)
    boxed = dataclasses.replace(order("j/c", ["true"], 0.5), image="localhost/any:1")
    supervisor.launch(boxed)
    await eventually(lambda: "j/c" in ended, what="the pod to end")
    run = ended["j/c"]
    assert run.state == PodState.FAILED
    assert "a container may have whole GPUs here, not a share" in run.reason
    assert not events(record) and not supervisor.mps_daemons.daemons  # type: ignore[union-attr]


async def test_a_daemon_that_cannot_be_told_its_limits_keeps_its_pod_from_starting(
    tmp_path: Path, data_dir: Path, standin: tuple[str, Path]
) -> None:
    _, record = standin
    control, _ = make_standin(tmp_path, fail="set_default_active_thread_percentage")
    ended: dict[str, PodRun] = {}
    supervisor = held(data_dir, control, ended)
    supervisor.launch(order("j/p", [*script(tmp_path, "client", CLIENT), "plain"], 0.25))
    await eventually(lambda: "j/p" in ended, what="the pod to end")
    run = ended["j/p"]
    assert run.state == PodState.FAILED
    assert run.reason.startswith("StartError: cannot hold the GPU share with MPS: ")
    assert "POD " not in supervisor.files.log_path("j/p", 0).read_text()  # its program never ran
    home = home_of(data_dir, 0.25)
    assert told(record, home)[-1] == "quit" and not home.exists()


async def test_a_killed_daemon_unenforces_the_node_until_the_next_pod_of_its_group_starts_it(
    tmp_path: Path, data_dir: Path, standin: tuple[str, Path]
) -> None:
    """A daemon killed under its pod: the node says its shares are not enforced (once in the
    log, in every heartbeat), the pod runs on; the next pod of the group starts the daemon
    again in its place (the first pod's new CUDA processes are held again) and the node
    enforces again."""
    control, _ = standin
    config = AgentConfig(
        server="127.0.0.1:1",
        node_name="n1",
        data_dir=data_dir,
        podman="",
        limits=False,
        gpu_sharing="mps",
        mps_control=control,
    )
    agent = Agent(config, Capacity(4000, 8 * GI, (GPU,)))
    assert agent.gpu_sharing().enforced
    supervisor = agent.supervisor
    daemons = supervisor.mps_daemons
    assert daemons is not None
    async with Gate() as gate:
        supervisor.launch(order("j/p", gate.command(tmp_path), 0.5))
        run = supervisor.runs["j/p"]
        await eventually(lambda: run.state == PodState.RUNNING, what="the pod to run")
        assert agent.gpu_sharing().enforced
        killed = daemons.daemons[group(0.5)]
        with capture_logs() as lines:
            os.kill(killed.pid, signal.SIGKILL)
            await eventually(lambda: not agent.gpu_sharing().enforced, what="unenforced")
            assert not agent.gpu_sharing().enforced  # said once
        gone = [line for line in lines if "MPS daemon is gone" in line["event"]]
        assert len(gone) == 1 and gone[0]["runs"] == ["j/p.0"]
        out: asyncio.Queue[agent_pb2.AgentMessage] = asyncio.Queue()
        agent.heartbeat_interval_s = 0.01
        beats = asyncio.create_task(agent._heartbeats(out))
        try:
            beat = (await asyncio.wait_for(out.get(), 10)).heartbeat
        finally:
            beats.cancel()
        assert beat.HasField("gpu_sharing") and not beat.gpu_sharing.enforced
        assert run.state == PodState.RUNNING and psutil.pid_exists(run.pid)  # not killed

        supervisor.launch(order("j/q", gate.command(tmp_path), 0.5))
        other = supervisor.runs["j/q"]
        await eventually(lambda: other.state == PodState.RUNNING, what="the next pod to run")
        back = daemons.daemons[group(0.5)]
        assert back.pid != killed.pid and back.alive() and agent.gpu_sharing().enforced
        assert daemons.runs[group(0.5)] == {"j/p.0", "j/q.0"}
        gate.open()
        await eventually(lambda: run.ended.is_set() and other.ended.is_set(), what="the pods")
    assert run.state == PodState.SUCCEEDED and agent.gpu_sharing().enforced
    assert not daemons.daemons and not home_of(data_dir, 0.5).exists()


async def test_a_daemon_left_by_a_dead_agent_is_stopped_and_a_running_pods_kept(
    tmp_path: Path, data_dir: Path, standin: tuple[str, Path]
) -> None:
    control, record = standin
    ended: dict[str, PodRun] = {}
    first = held(data_dir, control, ended)
    client = script(tmp_path, "client", CLIENT)
    homes = {"j/a": home_of(data_dir, 0.5), "j/b": home_of(data_dir, 0.25)}
    async with Gate() as stays, Gate() as goes:
        first.launch(order("j/a", [*client, "plain", str(stays.port)], 0.5))
        first.launch(order("j/b", [*client, "plain", str(goes.port)], 0.25))
        await eventually(
            lambda: all(first.runs[u].state == PodState.RUNNING for u in ("j/a", "j/b")),
            what="the pods to run",
        )
        for task in list(first._tasks):  # the agent dies; its pods and daemons run on
            task.cancel()
        await asyncio.gather(*first._tasks, return_exceptions=True)
        goes.open()  # j/b ends while no agent runs: its daemon is left behind
        await eventually(lambda: first.files.exit_path("j/b", 0).stat().st_size > 0, what="j/b")
        second = held(data_dir, control, ended)
        found = {run.uid: run for run in second.recover()}
        assert found["j/a"].state == PodState.RUNNING
        daemons = second.mps_daemons
        assert daemons is not None and set(daemons.daemons) == {group(0.5)}
        assert daemons.runs == {group(0.5): {"j/a.0"}}
        await eventually(lambda: not homes["j/b"].exists(), what="j/b's daemon to be stopped")
        assert told(record, homes["j/b"])[-1] == "quit"
        assert "quit" not in told(record, homes["j/a"]) and daemons.enforcing()
        stays.open()
        await eventually(found["j/a"].ended.is_set, what="j/a to end")
    assert told(record, homes["j/a"])[-1] == "quit" and not homes["j/a"].exists()


async def test_a_daemon_the_previous_release_made_for_one_run_is_kept_while_that_run_runs(
    data_dir: Path, standin: tuple[str, Path]
) -> None:
    """An agent upgraded while a pod runs under a daemon the previous release made for it
    alone (named by the run, its record without runs) follows that daemon as the run's own:
    it is not swept, the node enforces, and it is stopped once the run ends; a pod of the
    same share starting now gets a daemon of its group, not that one."""
    control, record = standin
    earlier = MpsDaemons(control, data_dir, {0: GPU})
    share = earlier.share_of("j/a.0", order("j/a", ["true"], 0.5), None)
    assert share is not None
    legacy = dataclasses.replace(
        share, group="j/a.0", home=daemon_home(data_dir / "mps", "j/a.0")
    )  # where and how 0.3.0 made it
    await earlier.start(legacy, None)
    daemon = earlier.daemons["j/a.0"]
    old = {"key": "j/a.0", "pid": daemon.pid, "started_at": daemon.started_at, "owner": None}
    (legacy.home / "daemon.json").write_text(json.dumps(old))  # 0.3.0's record: no runs

    upgraded = MpsDaemons(control, data_dir, {0: GPU})
    assert upgraded.adopt(["j/a.0"]) == []  # nothing swept
    assert upgraded.daemons == {"j/a.0": daemon} and upgraded.runs == {"j/a.0": {"j/a.0"}}
    assert upgraded.enforcing()
    later = upgraded.share_of("j/b.0", order("j/b", ["true"], 0.5), None)
    assert later is not None
    await upgraded.start(later, None)  # a pod of that share now: its group's own daemon
    assert set(upgraded.daemons) == {"j/a.0", group(0.5)}
    await upgraded.stop("j/a.0")
    assert told(record, legacy.home)[-1] == "quit" and not legacy.home.exists()
    await upgraded.stop("j/b.0")
    assert not upgraded.daemons and not home_of(data_dir, 0.5).exists()

    again = MpsDaemons(control, data_dir, {0: GPU})  # a daemon of no running run is swept
    await again.start(legacy, None)
    (legacy.home / "daemon.json").write_text(json.dumps(old))
    left = MpsDaemons(control, data_dir, {0: GPU}).adopt([])
    assert [d.key for d in left] == ["j/a.0"]
    await again.stop("j/a.0")


def share_of(daemons: MpsDaemons, uid: str, fraction: float) -> HeldShare:
    held = daemons.share_of(f"{uid}.0", order(uid, ["true"], fraction), None)
    assert held is not None
    return held


async def test_a_sweep_of_a_left_daemon_spares_the_fresh_daemon_of_its_group(
    data_dir: Path, standin: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent died and its pod ended unwatched, leaving its group's daemon. A pod of that
    group that the next agent starts before its sweep comes to that daemon gets a fresh one
    in the same directory: the sweep spares it, and ends the left process alone."""
    monkeypatch.setattr(mps, "QUIT_GRACE_S", 0.5)
    control, _ = standin
    dead_agent = MpsDaemons(control, data_dir, {0: GPU})
    await dead_agent.start(share_of(dead_agent, "j/a", 0.5), None)
    old = dead_agent.daemons[group(0.5)]
    agent = MpsDaemons(control, data_dir, {0: GPU})
    left = agent.adopt([])  # j/a no longer runs
    assert [d.key for d in left] == [group(0.5)]
    await agent.start(share_of(agent, "j/b", 0.5), None)
    fresh = agent.daemons[group(0.5)]
    assert fresh.pid != old.pid and fresh.alive()
    await agent.sweep(left)
    assert fresh.alive() and (home_of(data_dir, 0.5) / "pipe").is_dir()
    await eventually(lambda: not old.alive(), what="the left daemon to end")
    await agent.stop("j/b.0")
    assert not fresh.alive() and not agent._locks  # no lock outlives its use


async def test_a_failed_start_again_keeps_the_lost_groups_record_for_the_next_agent(
    tmp_path: Path, data_dir: Path, standin: tuple[str, Path]
) -> None:
    """A group's daemon died under its pod; the next pod of the group cannot start it again.
    The record stays, so an agent that restarts now still knows that pod runs without its
    daemon (the node does not enforce) instead of sweeping the directory and saying it does."""
    control, _ = standin
    failing, _ = make_standin(tmp_path, fail="set_default_active_thread_percentage")
    agent = MpsDaemons(control, data_dir, {0: GPU})
    await agent.start(share_of(agent, "j/a", 0.5), None)
    dead = agent.daemons[group(0.5)]
    os.kill(dead.pid, signal.SIGKILL)
    await eventually(lambda: not dead.alive(), what="the daemon to die")
    assert not agent.enforcing()
    agent.control = failing
    with pytest.raises(MpsError):
        await agent.start(share_of(agent, "j/b", 0.5), None)
    assert not agent.enforcing()
    restarted = MpsDaemons(control, data_dir, {0: GPU})
    assert restarted.adopt(["j/a.0"]) == [] and not restarted.enforcing()


async def test_a_daemon_no_record_names_is_told_quit_as_its_pipes_account(data_dir: Path) -> None:
    """A daemon whose start no record kept (its agent died before writing it) is swept: its
    `quit` goes as the account that owns its pipe directory, never as root into a directory
    a pod's account may fill with links."""
    if os.geteuid() != 0:
        pytest.skip("only a root agent switches accounts")
    os.chmod(data_dir, 0o755)
    said = data_dir / "uid.txt"
    said.touch()
    os.chmod(said, 0o666)
    control = data_dir / "nvidia-cuda-mps-control"
    control.write_text(f"#!/bin/sh\nid -u >> {said}\n")
    control.chmod(0o755)
    agent = MpsDaemons(str(control), data_dir, {0: GPU})
    home = share_of(agent, "j/a", 0.5).home
    (home / "pipe").mkdir(parents=True)
    os.chown(home / "pipe", 54321, 54321)  # the pod's account's, as a start makes it
    left = agent.adopt([])
    assert [d.key for d in left] == [""]
    await agent.sweep(left)
    assert said.read_text().split() == ["54321"] and not home.exists()


def test_shares_are_enforced_only_where_mps_is_asked_for_found_and_the_gpus_are_real(
    tmp_path: Path, data_dir: Path, standin: tuple[str, Path]
) -> None:
    control, _ = standin
    fake = GpuDevice(0, "fake-0", "FakeGPU", GI, fake=True)
    assert find_daemons("", control, tmp_path, (GPU,))[0] is None
    daemons, why = find_daemons("mps", str(tmp_path / "none-here"), tmp_path, (GPU,))
    assert daemons is None and "not found" in why
    assert find_daemons("mps", control, tmp_path, (fake,))[0] is None
    assert find_daemons("mps", control, tmp_path, ())[0] is None
    daemons, _ = find_daemons("mps", control, tmp_path, (GPU,))
    assert daemons is not None and daemons.enforcing()
    config = AgentConfig(
        server="127.0.0.1:1",
        node_name="n1",
        data_dir=data_dir,
        podman="",
        limits=False,
        gpu_sharing="mps",
        mps_control=str(tmp_path / "none-here"),
    )
    with capture_logs() as lines:
        agent = Agent(config, Capacity(4000, 8 * GI, (GPU,)))
    assert not agent._register().gpu_sharing.enforced
    assert any(line["event"] == "GPU shares are not enforced here" for line in lines)


def test_gpu_sharing_is_configured_with_mps_as_its_older_alias(tmp_path: Path) -> None:
    settings = tmp_path / "agent.yaml"
    for text, sharing in [
        ("gpuSharing: mps\n", "mps"),
        ("gpuSharing: none\n", ""),
        ("mps: true\n", "mps"),  # the older key says the same
        ("mps: false\n", ""),
        ("mps: true\ngpuSharing: mps\n", "mps"),
        ("{}\n", ""),
    ]:
        settings.write_text(text)
        config = load_agent_config(settings)
        assert (config.gpu_sharing, config.mps) == (sharing, sharing == "mps"), text
    assert config.mps_control == "nvidia-cuda-mps-control"
    settings.write_text("gpuSharing: mps\nmpsControl: /opt/cuda/bin/nvidia-cuda-mps-control\n")
    assert load_agent_config(settings).mps_control == "/opt/cuda/bin/nvidia-cuda-mps-control"
    for text, error in [
        ("gpuSharing: hami\n", "gpuSharing: must be one of mps, none"),
        ("mps: true\ngpuSharing: none\n", "mps and gpuSharing say different things"),
        ("mpsControl: ''\n", "mpsControl: must name the MPS control program"),
    ]:
        settings.write_text(text)
        with pytest.raises(AgentConfigError, match=error):
            load_agent_config(settings)


async def test_a_root_agent_runs_the_daemon_and_its_commands_as_the_pods_account() -> None:
    """Root never speaks to a daemon from inside directories the pod's account writes: the
    control program runs as that account (setpriv), the daemon it starts too."""
    if os.geteuid() != 0:
        pytest.skip("only a root agent switches accounts")
    with local_users(1) as (user,), shared_dir() as top:
        control = top / "nvidia-cuda-mps-control"
        control.write_text("#!/bin/sh\nid -u; id -G\n")
        control.chmod(0o755)
        daemons = MpsDaemons(str(control), top, {0: GPU})
        owner = (user.pw_uid, user.pw_gid)
        run = functools.partial(run_control, daemons.control, daemons.setpriv)
        code, said = await run([], {"PATH": os.defpath}, "quit", owner=owner)
        assert (code, said.split()) == (0, [str(user.pw_uid), str(user.pw_gid)])
        code, said = await run(["-d"], {"PATH": os.defpath}, None, top / "d.out", owner)
        assert (code, said.split()) == (0, [str(user.pw_uid), str(user.pw_gid)])
        code, said = await run([], {"PATH": os.defpath}, "quit")  # no pod account
        assert said.split()[0] == "0"
