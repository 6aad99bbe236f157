"""ExecPod end to end: a real server and agent, a running pod, commands run in it over the API.

The command sees what the pod sees (its environment, working directory, cgroup and account),
takes input, runs on a terminal when asked, and ends with the pod; each use is an event of
the job; a pod that is not running refuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest

from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from arranger.server.exec_relay import ARGUMENTS, EXEC, HIDDEN, MAX_INPUT, public_exec_event
from arranger.server.limits import UserLimits
from arranger.v1 import arranger_pb2, arranger_pb2_grpc, job_pb2
from tests.agent.rootagent import local_users, shared_dir
from tests.conftest import FAST, Gate, eventually, job_spec, running_cluster, script
from tests.containers import IMAGE, busybox_image
from tests.server.test_auth import issue, secure_agent, secured

# The leader writes what it sees, then waits at the gate.
SEEN = """
import json, os, socket, sys
seen = {"env": dict(os.environ), "cwd": os.getcwd(), "uid": os.getuid(),
        "cgroup": open("/proc/self/cgroup").read()}
with open(sys.argv[1] + ".part", "w") as f:
    json.dump(seen, f)
os.rename(sys.argv[1] + ".part", sys.argv[1])
socket.create_connection(("127.0.0.1", int(sys.argv[2]))).recv(1)
"""
SAME = (
    "import json, os, sys; json.dump({'env': dict(os.environ), 'cwd': os.getcwd(), "
    "'uid': os.getuid(), 'cgroup': open('/proc/self/cgroup').read()}, sys.stdout)"
)


async def run_in(
    stub: arranger_pb2_grpc.ArrangerStub,
    job: str,
    command: Sequence[str],
    given: Sequence[bytes] = (),
    tty: bool = False,
    pod: str = "",
) -> tuple[bytes, bytes, job_pb2.ExecEnded, str]:
    """run_in: a command's stdout, stderr, end and where it ran; `given` is its input."""

    begun = asyncio.Event()  # input goes once the command runs (a refusal comes first)

    async def requests() -> AsyncIterator[arranger_pb2.ExecRequest]:
        start = arranger_pb2.ExecStart(
            job=job, pod=pod, command=command, tty=tty, stdin=bool(given)
        )
        start.size.rows, start.size.cols = 24, 80
        yield arranger_pb2.ExecRequest(start=start)
        await begun.wait()
        for data in given:
            yield arranger_pb2.ExecRequest(input=data)
        yield arranger_pb2.ExecRequest(input_closed=True)
        await asyncio.Future()  # the call stays open until the command ends

    out, err, started = bytearray(), bytearray(), ""
    ended = None
    try:
        async with asyncio.timeout(30):
            async for reply in stub.ExecPod(requests()):
                kind = reply.WhichOneof("body")
                if kind == "started":
                    started = reply.started
                    begun.set()
                elif kind == "stdout":
                    out += reply.stdout
                elif kind == "stderr":
                    err += reply.stderr
                elif kind == "ended":
                    ended = reply.ended
    except TimeoutError:
        raise AssertionError(f"{command} did not end: {started=} {out=} {err=}") from None
    assert ended is not None, "the stream ended without the command's end"
    return bytes(out), bytes(err), ended, started


async def running_leader(
    client: AsyncClient, tmp_path: Path, gate: Gate, name: str = "shell"
) -> dict[str, object]:
    """running_leader: a job whose leader runs until the gate opens; what its leader saw."""
    seen = tmp_path / f"{name}.json"
    leader = [*script(tmp_path, "seen", SEEN), str(seen), str(gate.port)]
    spec = job_spec(name, leader=leader, worker=gate.command(tmp_path))
    spec["spec"]["leader"]["template"]["env"] = {"SECRET_WORD": "swordfish"}
    await client.submit(spec)
    await eventually(seen.exists, what="the leader wrote what it sees")
    await client.wait(name, stages=["Running"], timeout_s=30)
    return dict(json.loads(seen.read_text()))


@pytest.fixture
def stub(client: AsyncClient) -> arranger_pb2_grpc.ArrangerStub:
    """stub: the client's own stub (its channel carries the dev server's login)."""
    return client._stubs[0]


async def test_a_command_runs_as_the_pod_does(
    client: AsyncClient, stub: arranger_pb2_grpc.ArrangerStub, tmp_path: Path, gate: Gate
) -> None:
    seen = await running_leader(client, tmp_path, gate)
    out, err, ended, started = await run_in(stub, "shell", [sys.executable, "-c", SAME])
    assert ended.exit_code == 0 and ended.message == "", (ended, err)
    assert started.startswith("pod shell-learner of job shell on node ")
    got = json.loads(out)
    assert got["cwd"] == seen["cwd"] and got["uid"] == seen["uid"]
    assert got["cgroup"] == seen["cgroup"]  # the pod's cgroup, so its limits and device filter
    env = dict(seen["env"])  # type: ignore[call-overload]
    assert got["env"]["SECRET_WORD"] == "swordfish"
    for key in ("ARRANGER_JOB_NAME", "ARRANGER_POD_NAME", "ARRANGER_SCRATCH_DIR", "PATH"):
        assert got["env"].get(key) == env.get(key), key

    # Its exit code and its streams, apart.
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(7)"
    out, err, ended, _ = await run_in(stub, "shell", [sys.executable, "-c", code])
    assert (out, err, ended.exit_code) == (b"out\n", b"err\n", 7)

    # Input, in pieces.
    out, _, ended, _ = await run_in(stub, "shell", ["cat"], given=[b"one ", b"two\n"])
    assert (out, ended.exit_code) == (b"one two\n", 0)

    # A terminal: the command's stdin is one, of the size asked.
    tty = "import os, shutil; print(os.isatty(0), os.get_terminal_size(0).columns)"
    out, _, ended, _ = await run_in(stub, "shell", [sys.executable, "-c", tty], tty=True)
    assert ended.exit_code == 0 and out.replace(b"\r", b"").strip() == b"True 80", out

    # Input past its bound ends the command, naming the field.
    _, _, ended, _ = await run_in(stub, "shell", ["cat"], given=[b"x" * (MAX_INPUT + 1)])
    assert ended.exit_code == -1 and ended.message.startswith("input: at most"), ended

    # A program that cannot be found says so.
    _, _, ended, _ = await run_in(stub, "shell", ["no-such-program-x"])
    assert ended.exit_code == 127, ended

    # Each use is an event naming who ran what; the owner (here an admin) reads the arguments.
    events = await client.events("shell")
    ran = [e.message for e in events if e.kind == "Exec"]
    assert len(ran) == 6, ran
    assert ran[2] == f"{os.environ.get('USER') or ran[2].split()[0]} ran cat in pod shell-learner"
    assert ARGUMENTS + "-c " in ran[0] and HIDDEN not in ran[0]
    assert public_exec_event(ran[0]).endswith(ARGUMENTS + HIDDEN)
    assert "import" not in public_exec_event(ran[0])


async def test_a_command_ends_with_its_pod(
    client: AsyncClient, stub: arranger_pb2_grpc.ArrangerStub, tmp_path: Path, gate: Gate
) -> None:
    await running_leader(client, tmp_path, gate, "ending")

    async def started(name: str) -> tuple[asyncio.Task[Any], int]:
        marker = tmp_path / name
        code = (
            f"import os, pathlib, signal; pathlib.Path({str(marker)!r}).write_text(str(os.getpid()))"
            "; signal.pause()  # runs until it is ended"
        )
        running = asyncio.create_task(run_in(stub, "ending", [sys.executable, "-c", code]))
        await eventually(marker.exists, what="the command runs")
        return running, int(marker.read_text())

    # Its caller gone, the command goes.
    running, pid = await started("left")
    running.cancel()
    await eventually(lambda: not psutil.pid_exists(pid), what="the command of a caller gone ends")

    # Its pod ended, the command ends.
    running, pid = await started("ended")
    await client.stop("ending")
    gate.open()
    _, _, ended, _ = await running
    assert ended.exit_code in (137, 143, -1) or ended.message, ended
    await eventually(lambda: not psutil.pid_exists(pid), what="the command is gone")


async def test_a_pod_that_does_not_run_refuses(
    client: AsyncClient, stub: arranger_pb2_grpc.ArrangerStub, tmp_path: Path, gate: Gate
) -> None:
    await running_leader(client, tmp_path, gate, "runs")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await run_in(stub, "runs", ["true"], pod="no-such-pod")
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await run_in(stub, "runs", [])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "start.command" in (refused.value.details() or "")
    await client.stop("runs")
    gate.open()
    await client.wait("runs", timeout_s=30)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await run_in(stub, "runs", ["true"])
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "a command runs only in a Running pod" in (refused.value.details() or "")


async def test_a_command_runs_in_the_pods_container(
    client: AsyncClient, stub: arranger_pb2_grpc.ArrangerStub, tmp_path: Path, gate: Gate
) -> None:
    busybox_image()
    spec = job_spec("boxed", leader=["sh", "-c", "sleep 3600"], worker=gate.command(tmp_path))
    learner = spec["spec"]["leader"]["template"]
    learner.update(image=IMAGE, env={"MODE": "train"}, workingDir="/tmp")
    await client.submit(spec)
    await client.wait("boxed", stages=["Running"], timeout_s=90)
    out, err, ended, _ = await run_in(stub, "boxed", ["sh", "-c", 'echo "$MODE $(pwd)"; exit 3'])
    assert (out, ended.exit_code) == (b"train /tmp\n", 3), (err, ended)
    out, _, ended, _ = await run_in(stub, "boxed", ["cat"], given=[b"in the box\n"])
    assert (out, ended.exit_code) == (b"in the box\n", 0)
    await client.stop("boxed")
    gate.open()
    await client.wait("boxed", timeout_s=60)


async def test_only_the_owner_runs_commands_and_reads_their_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two real users, a root agent running pods as their owners: a command runs as the pod's
    account; another user may not run one, and reads its event without its arguments."""
    with local_users(2) as (alice, bob), shared_dir() as top:
        async with secured(tmp_path) as cluster:
            agent = secure_agent(cluster, top / "agent", path_prepend=(), run_as="owner")
            agent.start()
            try:
                await eventually(agent.connected.is_set, what="the root agent to join")
                tokens = [await issue(cluster, u.pw_name, capsys) for u in (alice, bob)]
                ca = cluster.tls / "ca.pem"
                async with (
                    AsyncClient(cluster.address, ca=ca, token=tokens[0]) as a,
                    AsyncClient(cluster.address, ca=ca, token=tokens[1]) as b,
                ):
                    await owners_only(a, b, alice.pw_name)
            finally:
                await agent.stop()


async def owners_only(a: AsyncClient, b: AsyncClient, alice: str) -> None:
    sleeper = ["/bin/sh", "-c", "exec sleep 3600"]
    await a.submit(job_spec("hers", sleeper, sleeper))
    await a.wait("hers", stages=["Running"], timeout_s=60)
    out, _, ended, _ = await run_in(a._stubs[0], "hers", ["/bin/sh", "-c", "id -un; echo $0"])
    assert (out.decode().split()[0], ended.exit_code) == (alice, 0)

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await run_in(b._stubs[0], "hers", ["id"])
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "only its owner or an admin may" in (refused.value.details() or "")

    mine = [e.message for e in await a.events("hers") if e.kind == "Exec"]
    theirs = [e.message for e in await b.events("hers") if e.kind == "Exec"]
    assert mine == [f"{alice} ran /bin/sh in pod hers-learner; arguments: -c 'id -un; echo $0'"]
    assert theirs == [f"{alice} ran /bin/sh in pod hers-learner; arguments: {HIDDEN}"]
    everything = [e.message for e in await b.events("") if e.kind == "Exec"]
    assert everything == theirs
    await a.stop("hers")
    await a.wait("hers", timeout_s=60)


async def test_the_cli_runs_a_command_and_exits_with_its_code(
    cluster: DevCluster, client: AsyncClient, tmp_path: Path, gate: Gate
) -> None:
    await running_leader(client, tmp_path, gate, "cli")

    async def arranger(*args: str, given: bytes = b"") -> tuple[int, bytes, bytes]:
        proc = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "arranger.client.cli", "--server", cluster.address, *args],
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(given), 60)
        assert proc.returncode is not None
        return proc.returncode, out, err

    code, out, err = await arranger("exec", "cli", "--", "sh", "-c", "echo in-pod; exit 3")
    assert (code, out) == (3, b"in-pod\n"), err
    code, out, err = await arranger("exec", "-i", "cli", "--", "cat", given=b"piped\n")
    assert (code, out) == (0, b"piped\n"), err
    code, out, err = await arranger("exec", "cli", "--pod", "nobody", "--", "true")
    assert code == 1 and b"has no pod 'nobody'" in err, err


async def call(
    stub: arranger_pb2_grpc.ArrangerStub,
    start: arranger_pb2.ExecStart,
    then: Sequence[arranger_pb2.ExecRequest] = (),
    pulled: list[int] | None = None,
) -> list[arranger_pb2.ExecReply]:
    """call: an ExecPod call's replies to its end; `then` follows the start at once, and
    `pulled` counts the requests gRPC has taken of it."""

    async def requests() -> AsyncIterator[arranger_pb2.ExecRequest]:
        yield arranger_pb2.ExecRequest(start=start)
        for request in then:
            yield request
            if pulled is not None:
                pulled.append(1)
        await asyncio.Future()

    replies = []
    async with asyncio.timeout(30):
        async for reply in stub.ExecPod(requests()):
            replies.append(reply)
            if reply.HasField("ended"):
                break
    return replies


async def test_a_terminal_past_its_largest_size_is_refused_naming_the_field(
    client: AsyncClient, stub: arranger_pb2_grpc.ArrangerStub, tmp_path: Path, gate: Gate
) -> None:
    await running_leader(client, tmp_path, gate, "tty")
    start = arranger_pb2.ExecStart(job="tty", command=["true"], tty=True)
    start.size.rows, start.size.cols = 70000, 80
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call(stub, start)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "start.size: rows and cols at most 65535"
    start.size.rows = 24
    resize = arranger_pb2.ExecRequest(resize=job_pb2.TerminalSize(rows=24, cols=1 << 20))
    start.command[:] = ["sleep", "30"]
    ended = (await call(stub, start, [resize]))[-1].ended
    assert ended.exit_code == -1 and ended.message == "resize: rows and cols at most 65535"


async def test_the_caller_gone_ends_a_command_that_reads_no_input(
    client: AsyncClient, stub: arranger_pb2_grpc.ArrangerStub, tmp_path: Path, gate: Gate
) -> None:
    """The input a command does not read fills every queue on the way; the caller gone, it
    ends all the same."""
    await running_leader(client, tmp_path, gate, "deaf")
    marker = tmp_path / "deaf.pid"
    code = (
        f"import os, pathlib, signal; pathlib.Path({str(marker)!r}).write_text(str(os.getpid()))"
        "; signal.pause()  # runs until it is ended"
    )
    start = arranger_pb2.ExecStart(job="deaf", command=[sys.executable, "-c", code], stdin=True)
    flood = [arranger_pb2.ExecRequest(input=b"x" * MAX_INPUT) for _ in range(200)]
    pulled: list[int] = []
    task = asyncio.create_task(call(stub, start, flood, pulled))
    await eventually(marker.exists, what="the command runs")
    pid = int(marker.read_text())
    await eventually(lambda: len(pulled) >= 40, what="input past what the agent holds")
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await eventually(lambda: not psutil.pid_exists(pid), what="the command of a caller gone ends")


async def test_every_use_is_an_event_past_the_jobs_event_budget(tmp_path: Path, gate: Gate) -> None:
    limits = dataclasses.replace(UserLimits(), events_per_job=20)
    config = dataclasses.replace(FAST, limits=limits)
    async with (
        running_cluster(tmp_path / "c", config=config) as cluster,
        AsyncClient(cluster.address, timeout_s=10) as client,
    ):
        await running_leader(client, tmp_path, gate, "quiet")
        for i in range(25):
            start = arranger_pb2.ExecStart(job="quiet", command=["echo", str(i)])
            assert (await call(client._stubs[0], start))[-1].ended.exit_code == 0
        ran = [e.message for e in await client.events("quiet") if e.kind == EXEC]
        await client.stop("quiet")
        gate.open()
        await client.wait("quiet", timeout_s=30)
    assert len(ran) == 25, ran


async def test_the_caller_gone_ends_a_command_in_a_container(
    client: AsyncClient, stub: arranger_pb2_grpc.ArrangerStub, tmp_path: Path, gate: Gate
) -> None:
    """podman runs the command under its conmon, in no process group of the agent's: the
    agent finds it by the mark in its environment."""
    busybox_image()
    spec = job_spec("gone", leader=["sh", "-c", "sleep 3600"], worker=gate.command(tmp_path))
    spec["spec"]["leader"]["template"].update(image=IMAGE)
    await client.submit(spec)
    await client.wait("gone", stages=["Running"], timeout_s=90)

    def found() -> list[psutil.Process]:
        def words(p: psutil.Process) -> list[str]:
            with contextlib.suppress(psutil.Error):
                return p.cmdline()
            return []

        return [p for p in psutil.process_iter() if words(p) == ["sleep", "3597"]]

    task = asyncio.create_task(
        call(stub, arranger_pb2.ExecStart(job="gone", command=["sleep", "3597"]))
    )
    await eventually(found, what="the command runs in the container")
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await eventually(lambda: not found(), what="the command of a caller gone ends")
    await client.stop("gone")
    gate.open()
    await client.wait("gone", timeout_s=60)
