"""Pods that name an image run in real podman containers: the environment contract and volumes
as the spec says, logs in the pod's log, a stop that leaves no container behind, a missing
image that fails at once with podman's message, an OOM kill seen, and a restarted agent that
takes its containers back. Skipped where podman cannot run the test image."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pwd
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from arranger.agent.accounts import Accounts
from arranger.agent.config import PodUser
from arranger.agent.fence import AgentLock, ServerContact
from arranger.agent.fence import files as fence_files
from arranger.agent.launcher import ROOT_PATH
from arranger.agent.orders import GpuGrant, KillOrder, LaunchOrder, Volume
from arranger.agent.podman import Podman, container_name, podman_env
from arranger.agent.podman_runtime import PodmanRuntime
from arranger.agent.process import started_at
from arranger.agent.runs import PodRun
from arranger.agent.runtime import CONTAINER_SCRATCH, PodLaunch, StartError
from arranger.agent.supervisor import Supervisor
from arranger.states import PodState
from tests.conftest import eventually
from tests.containers import IMAGE, busybox_image, containers_of

MIB = 2**20


@pytest.fixture
def podman() -> Podman:
    return busybox_image()


@pytest.fixture
def node(podman: Podman) -> Iterator[str]:
    name = f"test-{os.getpid()}"
    yield name
    assert containers_of(podman, name) == [], "containers were left behind"


class Agent:
    """Agent: a supervisor with the podman runtime over one data directory, as arranger-agent
    builds it; `ended` collects the runs that ended."""

    def __init__(
        self,
        data_dir: Path,
        podman: Podman,
        node: str,
        limits: bool = False,
        pull: str = "missing",
        accounts: Accounts | None = None,
    ) -> None:
        self.ended: dict[str, PodRun] = {}
        runtime = PodmanRuntime(podman, node, limits=limits, pull=pull)
        self.supervisor = Supervisor(
            node, "127.0.0.1", data_dir, self._changed, containers=runtime, accounts=accounts
        )

    def _changed(self, run: PodRun) -> None:
        if run.ended.is_set():
            self.ended[run.uid] = run

    async def finished(self, uid: str, timeout_s: float = 60) -> PodRun:
        return await eventually(lambda: self.ended.get(uid), timeout_s, f"{uid} to end")

    def log(self, uid: str) -> str:
        return self.supervisor.files.log_path(uid, 0).read_text()


@pytest.fixture
async def agent(tmp_path: Path, podman: Podman, node: str) -> AsyncIterator[Agent]:
    a = Agent(tmp_path / "agent", podman, node)
    yield a
    await a.supervisor.shutdown(grace_s=1)


def order(uid: str, script: str, **fields: Any) -> LaunchOrder:
    job, _, pod = uid.partition("/")
    return LaunchOrder(
        uid=uid,
        attempt=0,
        job_id=job,
        pod_name=pod,
        image=IMAGE,
        command=("sh", "-c"),
        args=(script,),
        cpu_cores=0.5,
        memory_bytes=64 * MIB,
        **fields,
    )


async def test_a_container_gets_the_contract_its_volumes_and_its_log(
    agent: Agent, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    launch = order(
        "j1/learner",
        'env > /data/env; pwd > /data/cwd; echo "to stdout"; echo "to stderr" >&2; '
        'echo hi > "$ARRANGER_SCRATCH_DIR/note"',
        env={"ARRANGER_ROLE": "leader", "MODE": "train"},
        ports={"rpc": 0},
        leader_port_name="rpc",
        volumes=(Volume("data", str(data), "/data"),),
    )
    agent.supervisor.launch(launch)
    run = await agent.finished("j1/learner")
    log = agent.log("j1/learner")
    assert (run.state, run.exit_code, run.runtime) == (PodState.SUCCEEDED, 0, "podman"), log
    env = dict(line.split("=", 1) for line in (data / "env").read_text().splitlines())
    port = run.ports["rpc"]
    assert env["MODE"] == "train" and env["ARRANGER_ROLE"] == "leader"
    assert (
        env["ARRANGER_PORT_RPC"] == str(port) and env["ARRANGER_LEADER_ADDR"] == f"127.0.0.1:{port}"
    )
    assert (
        env["ARRANGER_VOLUME_DATA"] == "/data" and env["ARRANGER_SCRATCH_DIR"] == CONTAINER_SCRATCH
    )
    assert env["ARRANGER_NODE_NAME"] == agent.supervisor.node_name
    assert env["PATH"] == "/bin", "the agent's own PATH leaked into the container"
    assert (data / "cwd").read_text().strip() == "/work"  # the image's WORKDIR
    assert "to stdout" in log and "to stderr" in log
    assert (agent.supervisor.files.scratch_dir("j1/learner") / "note").read_text() == "hi\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="running a container as its owner needs root")
async def test_a_container_runs_as_its_owner_without_capabilities(
    podman: Podman, node: str
) -> None:
    who = pwd.getpwnam("nobody")
    with tempfile.TemporaryDirectory() as top:  # pytest's own are private to root
        os.chmod(top, 0o755)
        agent = Agent(Path(top) / "agent", podman, node, accounts=Accounts(node, owners=True))
        try:
            script = (
                "cat /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/pids.max 2>/dev/null; "
                "id -u; id -g; grep CapEff /proc/self/status; grep NoNewPrivs /proc/self/status"
            )
            agent.supervisor.launch(order("j9/owned", script, owner="nobody"))
            run = await agent.finished("j9/owned")
        finally:
            await agent.supervisor.shutdown(grace_s=1)
        log = agent.log("j9/owned")
        assert run.state == PodState.SUCCEEDED, log
        pids, uid, gid, caps, nnp = log.splitlines()[-5:]
        assert pids == "4096", log  # the agent's default pids limit
        assert (uid, gid) == (str(who.pw_uid), str(who.pw_gid))
        assert caps.split() == ["CapEff:", "0000000000000000"] and nnp.split() == [
            "NoNewPrivs:",
            "1",
        ]


async def test_a_stopped_container_is_killed_and_removed(agent: Agent, podman: Podman) -> None:
    agent.supervisor.launch(order("j2/actor", "trap 'exit 7' TERM; while :; do sleep 1; done"))
    await eventually(lambda: agent.supervisor.runs["j2/actor"].state == PodState.RUNNING)
    assert containers_of(podman, agent.supervisor.node_name)
    agent.supervisor.kill(KillOrder("j2/actor", 0, grace_s=10))
    run = await agent.finished("j2/actor")
    assert (run.state, run.exit_code) == (PodState.KILLED, 7)  # it had its SIGTERM
    assert containers_of(podman, agent.supervisor.node_name) == []


async def test_a_missing_image_fails_the_pod_with_podmans_message(
    tmp_path: Path, podman: Podman, node: str
) -> None:
    agent = Agent(tmp_path / "agent", podman, node, pull="never")  # no registry is asked
    launch = dataclasses.replace(order("j3/p", "true"), image="localhost/no-such-image:1")
    agent.supervisor.launch(launch)
    run = await agent.finished("j3/p", timeout_s=30)
    assert (run.state, run.exit_code) == (PodState.FAILED, 125)
    assert run.reason == "ContainerError: Error: localhost/no-such-image:1: image not known"
    assert "image not known" in agent.log("j3/p")


async def test_an_image_that_cannot_be_pulled_fails_the_pod_with_podmans_message(
    tmp_path: Path, podman: Podman, node: str
) -> None:
    agent = Agent(tmp_path / "agent", podman, node, pull="missing")  # no registry answers
    launch = dataclasses.replace(order("j3/pull", "true"), image="localhost/no-such-image:1")
    agent.supervisor.launch(launch)
    run = await agent.finished("j3/pull", timeout_s=60)
    assert (run.state, run.exit_code) == (PodState.FAILED, 125)
    start = "ImagePullFailed: image localhost/no-such-image:1: Error: "
    assert run.reason.startswith(start) and "\n" not in run.reason, run.reason
    assert "Trying to pull localhost/no-such-image:1" in agent.log("j3/pull")


@pytest.mark.parametrize("init", [True, False], ids=["init", "no-init"])
async def test_a_command_the_image_cannot_start_fails_the_pod_saying_so(
    tmp_path: Path, podman: Podman, node: str, init: bool
) -> None:
    if init and not podman.init:
        pytest.skip("podman's init (catatonit) is not installed")
    agent = Agent(tmp_path / "agent", dataclasses.replace(podman, init=init), node)
    try:
        for uid, command in (("j5/missing", "no-such-command-xyz"), ("j5/dir", "/bin")):
            launch = dataclasses.replace(order(uid, ""), command=(command,), args=())
            agent.supervisor.launch(launch)
        missing, directory = await agent.finished("j5/missing"), await agent.finished("j5/dir")
        assert missing.state == PodState.FAILED and missing.exit_code in (1, 127)
        start = "ContainerCommandNotFound: cannot start `no-such-command-xyz`: "
        assert missing.reason.startswith(start), missing.reason
        assert f"arranger: {missing.reason.partition(': ')[2]}\n" in agent.log("j5/missing")
        assert directory.state == PodState.FAILED
        assert directory.reason.startswith("ContainerCannotRun: cannot start `/bin`: ")
    finally:
        await agent.supervisor.shutdown(grace_s=1)


async def test_a_container_that_exceeds_its_memory_is_oom_killed(
    tmp_path: Path, podman: Podman, node: str
) -> None:
    agent = Agent(tmp_path / "agent", podman, node, limits=True)
    try:
        hog = 'x=a; while :; do x="$x$x"; done'
        agent.supervisor.launch(order("j4/hog", hog))
        run = await agent.finished("j4/hog")
        assert (run.state, run.reason) == (PodState.FAILED, "OOMKilled"), agent.log("j4/hog")
        assert not list(agent.supervisor.files.record_path("j4/hog").parent.glob("*.podman"))
    finally:
        await agent.supervisor.shutdown(grace_s=1)


async def test_a_restarted_agent_takes_its_containers_back(
    tmp_path: Path, podman: Podman, node: str
) -> None:
    release = tmp_path / "release"
    release.mkdir()
    first = Agent(tmp_path / "agent", podman, node)
    for pod, flag, code in (("stays", "go", 3), ("ends", "end", 4)):
        launch = order(
            f"j5/{pod}",
            f"while [ ! -e /release/{flag} ]; do sleep 0.1; done; exit {code}",
            volumes=(Volume("release", str(release), "/release"),),
        )
        first.supervisor.launch(launch)
    runs = first.supervisor.runs
    await eventually(lambda: all(r.state == PodState.RUNNING for r in runs.values()))
    # The first agent dies without a word: its runs stay recorded, its containers run on,
    # and one of them ends while no agent watches.
    for task in list(first.supervisor._tasks):
        task.cancel()
    await asyncio.gather(*first.supervisor._tasks, return_exceptions=True)
    (release / "end").touch()
    name, conmon = container_name(node, "j5/ends.0"), runs["j5/ends"].pid
    await eventually(lambda: _status(podman, name) == "exited", what="ends to exit")
    await eventually(lambda: started_at(conmon) is None, what="its conmon to go")

    second = Agent(tmp_path / "agent", podman, node)
    try:
        found = {run.pod_name: run for run in second.supervisor.recover()}
        assert (found["ends"].state, found["ends"].exit_code) == (PodState.FAILED, 4)
        assert found["stays"].state == PodState.RUNNING
        assert found["stays"].pid == runs["j5/stays"].pid  # the same conmon, watched again
        assert containers_of(podman, node) == [container_name(node, "j5/stays.0")]
        (release / "go").touch()
        run = await second.finished("j5/stays")
        assert (run.state, run.exit_code) == (PodState.FAILED, 3)
    finally:
        await second.supervisor.shutdown(grace_s=1)


def _status(podman: Podman, name: str) -> str:
    done = subprocess.run(
        [*podman.base, "container", "inspect", "--format", "{{.State.Status}}", name],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip()


def test_the_podman_command_line_carries_gpus_volumes_user_and_a_private_env_file(
    tmp_path: Path,
) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    for device in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm"):
        (dev / device).touch()
    podman = Podman("/usr/bin/podman", "4.3.1", "runc", init=False)
    user = PodUser("jobs", 1001, 1002, (1002, 44), "/home/jobs")
    runtime = PodmanRuntime(podman, "n1", dev=dev)
    launch_order = order(
        "j/p",
        "true",
        working_dir="/work/here",
        gpus=(GpuGrant(2), GpuGrant(0)),
        volumes=(Volume("ro", "/srv/data", "/data", read_only=True),),
    )
    env_file = tmp_path / "p.env"
    launch = PodLaunch(
        key="j/p.0",
        argv=["sh", "-c", "true"],
        cwd=Path("/work/here"),
        scratch=tmp_path / "s",
        env={"CUDA_VISIBLE_DEVICES": "GPU-c,GPU-a", "SECRET": "x"},
        log_path=tmp_path / "log",
        exit_file=tmp_path / "p.0.exit",
        order=launch_order,
        user=user,
    )
    argv = runtime.run_argv(launch, env_file)
    assert argv[:8] == [
        "/usr/bin/podman",
        "--runtime",
        "runc",
        "--cgroup-manager",
        "cgroupfs",
        "--events-backend",
        "file",
        "run",
    ]
    flags = " ".join(argv)
    assert "--init" not in argv and "--network host" in flags
    assert "--user 1001:1002 --security-opt no-new-privileges --cap-drop=all" in flags
    assert "--group-add=44" in argv and "--group-add=1002" not in argv
    assert not {"--privileged", "--pid", "--ipc", "--pid=host", "--ipc=host"} & set(argv)
    assert f"--memory={64 * MIB}" in argv and "--cpus=0.5" in argv
    assert "--pids-limit=4096" in argv  # the agent's default; the pod may ask another
    assert f"--device={dev}/nvidia2 --device={dev}/nvidia0" in flags
    assert f"--device={dev}/nvidiactl --device={dev}/nvidia-uvm" in flags
    assert "nvidia1" not in flags  # another pod's GPU
    assert "--volume /srv/data:/data:ro" in flags and "--workdir /work/here" in flags
    assert argv[-4:] == ["--entrypoint", '["sh", "-c"]', IMAGE, "true"]
    assert "SECRET" not in flags and "--env" not in argv  # values only in the private file
    assert env_file.stat().st_mode & 0o777 == 0o600
    lines = env_file.read_text().splitlines()
    assert "CUDA_VISIBLE_DEVICES=GPU-c,GPU-a" in lines  # the launch's environment, as it is
    assert "SECRET=x" in lines

    def changed(**fields: Any) -> PodLaunch:
        return dataclasses.replace(launch, order=dataclasses.replace(launch_order, **fields))

    assert "--pids-limit=77" in runtime.run_argv(changed(pids=77), env_file)
    small = changed(cpu_cores=0.05)  # below CPU_AT_START: set by `podman update` once it runs
    assert not [a for a in runtime.run_argv(small, env_file) if a.startswith("--cpus")]
    odd = (*launch_order.volumes, Volume("odd", "/srv/a:b", "/odd"))
    with pytest.raises(StartError, match="hostPath with ':' or ','"):
        runtime.run_argv(changed(volumes=odd), env_file)


def test_a_value_the_env_file_cannot_hold_fails_the_pod_and_never_reaches_podman(
    tmp_path: Path,
) -> None:
    runtime = PodmanRuntime(Podman("/usr/bin/podman", "4.3.1", "runc", init=False), "n1")
    launch = PodLaunch(
        key="j/p.0",
        argv=["sh"],
        cwd=None,
        scratch=tmp_path / "s",
        env={"MULTI": "a\nb"},
        log_path=tmp_path / "log",
        exit_file=tmp_path / "p.0.exit",
        order=order("j/p", "true"),
    )
    with pytest.raises(StartError, match="env 'MULTI' holds a line break"):
        runtime.run_argv(launch, tmp_path / "p.env")
    assert not (tmp_path / "p.env").exists()


async def test_a_pod_stopped_while_its_image_is_pulled_ends_killed_at_once(tmp_path: Path) -> None:
    slow = tmp_path / "podman"  # a podman whose `run` pulls for a minute
    slow.write_text('#!/bin/sh\ncase "$*" in *" run "*) exec sleep 60;; esac\nexit 0\n')
    slow.chmod(0o755)
    podman = Podman(str(slow), "4.3.1", "runc", init=False)
    agent = Agent(tmp_path / "agent", podman, "n1")
    agent.supervisor.launch(order("j6/p", "true"))
    await eventually(lambda: agent.supervisor.containers._starting, what="podman run to start")  # type: ignore[union-attr]
    started = time.monotonic()
    agent.supervisor.kill(KillOrder("j6/p", 0, grace_s=30))
    run = await agent.finished("j6/p")
    assert (run.state, run.reason) == (PodState.KILLED, "Killed")
    assert time.monotonic() - started < 10, "the stop waited for the pull"
    await agent.supervisor.shutdown(grace_s=1)


def test_podman_runs_in_an_environment_of_the_agents_making(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LD_PRELOAD", "/tmp/evil.so")
    monkeypatch.setenv("PATH", "/tmp/evil")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    env = podman_env()
    assert env["PATH"] == ROOT_PATH and env["XDG_RUNTIME_DIR"] == "/run/user/1000"
    assert "LD_PRELOAD" not in env


@pytest.mark.timeout(120)
async def test_a_container_without_an_agent_is_fenced_after_the_timeout(
    tmp_path: Path, podman: Podman, node: str
) -> None:
    data = tmp_path / "agent"
    lock = AgentLock(data)
    lock.acquire()
    ServerContact(data, 1.0).set_timeout(1.0)  # a server was heard just now; fence after 1 s
    runtime = PodmanRuntime(podman, node, fence=fence_files(data))
    ended: dict[str, PodRun] = {}
    supervisor = Supervisor(
        node,
        "127.0.0.1",
        data,
        lambda r: r.ended.is_set() and ended.setdefault(r.uid, r),
        containers=runtime,
    )
    supervisor.launch(order("jf/learner", "trap 'exit 7' TERM; while :; do sleep 1; done"))
    await eventually(lambda: supervisor.runs["jf/learner"].state == PodState.RUNNING)
    heard = (data / "server-heard").stat().st_mtime
    lock.release()  # the agent stops (or crashes), and nobody hears the server any more
    run = await eventually(lambda: ended.get("jf/learner"), 60, "the container to be fenced")
    assert time.time() >= heard + 1.0, "never before the fence timeout"
    assert run.exit_code == 7, run  # it had its SIGTERM (an agent started later reads the mark)
    assert (
        supervisor.files.exit_path("jf/learner", 0).with_suffix(".kill").read_text() == "Fenced\n"
    )
    assert "arranger: fenced" in supervisor.files.log_path("jf/learner", 0).read_text()
    await supervisor.shutdown(grace_s=1)
