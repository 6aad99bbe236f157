"""A job's own token end to end: a TLS server with two users' tokens and a real agent; the
learner reads ARRANGER_JOB_TOKEN, ARRANGER_API and ARRANGER_API_CA from its environment and
uses them with arranger.job.current(). It reaches its own job and nothing else; the token shows
in no reply, event, CLI output or log line; it stops working, and its streams end, when the
job is stopped."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from structlog.testing import capture_logs

import arranger
from arranger.client.sdk import AsyncClient
from tests.conftest import FAST, Gate, eventually, job_spec, script
from tests.server.test_auth import in_thread, issue, secure_agent, secured
from tests.server.test_job_tokens import ALLOWED, OWN_ONLY, Caller, drained, refused

LEARNER = """
import json, os, pathlib, signal, socket, grpc
from arranger.job import current
from arranger.v1 import arranger_pb2 as pb
out = pathlib.Path(os.environ["OUT"])
job = current()

def answer(call):
    try:
        call()
        return "OK"
    except grpc.RpcError as exc:
        return f"{exc.code().name}: {exc.details()}"

md, stub = job._metadata, job._stubs[0]
seen = {
    "tls": bool(os.environ.get("ARRANGER_API_CA")),
    "token": os.environ["ARRANGER_JOB_TOKEN"],
    "members": [[m.name, m.rank] for m in job.members()],
    "scale": answer(lambda: job.scale("actors", 2)),
    "checkpoint": answer(job.checkpointed),
    "other": answer(lambda: stub.GetJob(pb.GetJobRequest(name=os.environ["OTHER"]), metadata=md)),
    "list": answer(lambda: stub.ListJobs(pb.ListJobsRequest(), metadata=md)),
    "stop": answer(lambda: stub.StopJob(pb.StopJobRequest(name=job.id), metadata=md)),
}
(out / "seen.part").write_text(json.dumps(seen))
(out / "seen.part").rename(out / "seen.json")
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stopped, it stays until the gate opens
with open(out / "events", "a") as events:
    for event in job.events():  # until the stream ends: when the job is stopped
        events.write(f"{event.kind} {event.member.name}\\n")
        events.flush()
    events.write("ended\\n")
socket.create_connection(("127.0.0.1", int(os.environ["GATE"]))).recv(1)
"""
STUBBORN = """
import signal, socket, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
socket.create_connection(("127.0.0.1", int(sys.argv[1]))).recv(1)
"""
# Pods that ignore SIGTERM are killed only after 30 s: until the gate opens, the job stops.
STOPPING = dataclasses.replace(FAST.controller, kill_grace_s=30.0)


@contextlib.contextmanager
def logged() -> Iterator[list[dict[str, Any]]]:
    """logged: every log line of this process (server and agent), whatever its level."""
    with capture_logs() as lines:
        yield lines


async def test_a_pod_uses_its_own_token_over_tls_and_only_on_its_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    learner = script(tmp_path, "learner", LEARNER)
    stubborn = script(tmp_path, "stubborn", STUBBORN)
    with logged() as lines:
        async with secured(tmp_path, controller=STOPPING) as cluster, Gate() as gate:
            assert cluster.server is not None
            tls = cluster.tls
            agent = secure_agent(cluster, tmp_path / "agent")
            agent.start()
            try:
                await eventually(agent.connected.is_set, what="the agent to join")
                alice_token = await issue(cluster, "alice", capsys)
                bob_token = await issue(cluster, "bob", capsys)
                ca = tls / "ca.pem"
                async with (
                    AsyncClient(cluster.address, ca=ca, token=alice_token) as alice,
                    AsyncClient(cluster.address, ca=ca, token=bob_token) as bob,
                ):
                    await bob.submit(job_spec("bobs", ["true"], ["true"]))
                    spec = job_spec("el", learner, [*stubborn, str(gate.port)], workers=1)
                    spec["spec"]["workerSets"][0]["maxCounts"] = 3
                    repo = str(Path(arranger.__file__).parents[1])  # the code under test
                    env = {
                        "OUT": str(out),
                        "OTHER": "bobs",
                        "PYTHONPATH": repo,
                        "GATE": str(gate.port),
                    }
                    spec["spec"]["leader"]["template"]["env"] = env
                    job = await alice.submit(spec)
                    token = cluster.server.job_tokens.token(job.metadata.id)

                    await eventually((out / "seen.json").exists, what="the learner's calls")
                    seen = json.loads((out / "seen.json").read_text())
                    assert seen["tls"] and seen["token"] == token
                    assert seen["members"] == [["el-learner", -1], ["el-actors-0", 0]]
                    assert seen["scale"] == "OK"
                    assert seen["checkpoint"] == "OK"  # kept, with no notice running
                    assert seen["other"].startswith(f"PERMISSION_DENIED: name: {OWN_ONLY}")
                    for call in ("list", "stop"):
                        name = {"list": "ListJobs", "stop": "StopJob"}[call]
                        assert seen[call] == f"PERMISSION_DENIED: {name}: {ALLOWED}, on its own job"

                    # Once the learner watches its job, a third actor is news to it.
                    def watching() -> bool:
                        subscriptions = cluster.server.watch.subscriptions  # type: ignore[union-attr]
                        return any(s.job == job.metadata.id for s in subscriptions)

                    await eventually(watching, what="the learner to watch its job")
                    await alice.scale("el", "actors", 3)

                    def started() -> bool:
                        events = out / "events"
                        return events.exists() and "started el-actors-2" in events.read_text()

                    await eventually(started, what="the learner to hear of its new actor")

                    # The token shows nowhere a user looks.
                    replies: list[Any] = [
                        await alice.get("el"),
                        await alice.jobs(),
                        await alice.events("el"),
                        await bob.get("el"),
                    ]
                    async for msg in alice.watch("el"):
                        replies.append(msg)
                        if msg.type == "SYNCED":
                            break
                    for reply in replies:
                        assert token not in str(reply)
                    capsys.readouterr()
                    argv = ("--server", cluster.address, "--ca", str(ca), "--token", alice_token)
                    assert await in_thread(*argv, "get", "el", "-o", "yaml") == 0
                    assert await in_thread(*argv, "events", "el") == 0
                    printed = capsys.readouterr()
                    assert "el-learner" in printed.out and token not in printed.out + printed.err

                    # Deleted: the token is refused at once and its open streams end, while
                    # the job's pods, which ignore SIGTERM, still live (the job is not gone).
                    ca_pem = ca.read_bytes()
                    async with Caller(cluster.address, token, ca_pem) as as_job:
                        watch = as_job.watch(job.metadata.id)
                        assert (await watch.read()).type == "ADDED"
                        await alice.delete("el")
                        error = await refused(drained(watch))
                        assert error.code() == grpc.StatusCode.UNAUTHENTICATED, error
                        for call in (
                            lambda: as_job.get(job.metadata.id),
                            lambda: as_job.scale("el", 3),
                        ):
                            error = await refused(call())
                            assert error.code() == grpc.StatusCode.UNAUTHENTICATED, error
                        await eventually(
                            lambda: "ended" in (out / "events").read_text(),
                            what="the learner's own stream to end, the learner still alive",
                        )
                        assert cluster.server.controller.view.job(job.metadata.id) is not None
                        gate.open()
                        await eventually(
                            lambda: cluster.server.controller.view.job(job.metadata.id) is None,  # type: ignore[union-attr]
                            what="the job to be gone",
                        )
                        error = await refused(as_job.get(job.metadata.id))
                        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
            finally:
                await agent.stop()
    leaked = [line for line in lines if token in str(line)]
    assert not leaked, leaked
    assert any(line.get("event") == "agent connected" for line in lines)  # logs were caught
