"""What an agent says of a job's pods reaches other users without the job's hidden values.

An agent's reason for a pod can echo what the job was given (the PATH a start failure searched,
the host path a container runtime could not mount); it becomes the pod's reason, the job's
message, its events and its history record, which every user reads. Here an agent played over
mutual TLS says so of alice's jobs, and bob reads every one of those places.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from arranger.client.specfile import load_job_data
from arranger.security import TlsFiles, channel_credentials
from arranger.server.redaction import REASON_CHARS, Hidden, public_reason
from arranger.server.validation import parse_job
from arranger.spec import JobSpec
from arranger.v1 import agent_pb2, agent_pb2_grpc
from tests.conftest import eventually, job_spec
from tests.played_agent import Stream, launches, registration
from tests.server.test_auth import Secured
from tests.server.test_tenancy import lab


@contextlib.asynccontextmanager
async def tls_agent(cluster: Secured) -> AsyncIterator[Stream]:
    """tls_agent: node secure-0's stream to the cluster, over its mutual TLS, registered."""
    tls = cluster.tls
    credentials = channel_credentials(
        TlsFiles(tls / "ca.pem", tls / "secure-0.pem", tls / "secure-0.key")
    )
    async with grpc.aio.secure_channel(cluster.agents, credentials) as channel:
        stream: Stream = agent_pb2_grpc.AgentServiceStub(channel).Connect()
        await stream.write(agent_pb2.AgentMessage(register=registration("secure-0")))
        await stream.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat()))
        try:
            yield stream
        finally:
            stream.cancel()


async def leader_launch(stream: Stream, job: str) -> agent_pb2.LaunchPod:
    """leader_launch: the next launch of job `job`'s leader (other launches are let be)."""
    while True:
        (launch,) = await launches(stream, 1)
        if launch.job_name == job and launch.pod_name.endswith("learner"):
            return launch


async def failed(
    stream: Stream, launch: agent_pb2.LaunchPod, reason: str, code: int | None
) -> None:
    report = agent_pb2.PodReport(
        pod_uid=launch.pod_uid,
        attempt=launch.attempt,
        state="Failed",
        reason=reason,
        exit_code=code,
        finish_time=time.time(),
    )
    await stream.write(agent_pb2.AgentMessage(pod_reports=agent_pb2.PodReports(reports=[report])))


async def test_other_users_never_read_a_job_s_hidden_values_in_what_agents_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = f"/opt/alice-secret-bin:{tmp_path}/private-tools"
    mount = f"{tmp_path}/alice-data"
    secrets = ["/opt/alice-secret-bin", f"{tmp_path}/private-tools", mount, "key-42-secret"]
    async with lab(tmp_path, capsys) as it, tls_agent(it.cluster) as agent:
        pathy = job_spec("pathy", ["no-such-prog", "--key", "key-42-secret"], ["true"])
        pathy["spec"]["leader"]["template"]["env"] = {"PATH": path}  # type: ignore[index]
        await it.alice.submit(pathy)
        launch = await leader_launch(agent, "pathy")
        not_found = f"No such file or directory (not found in PATH={path}) key-42-secret"
        await failed(
            agent, launch, f"CommandNotFound: cannot start `no-such-prog`: {not_found}", 127
        )

        volumes = [{"name": "data", "hostPath": mount, "mountPath": "/data"}]
        mounty = job_spec("mounty", ["true"], volumes=volumes, restartLimit=1)
        await it.alice.submit(mounty)
        statfs = f"ContainerError: statfs {mount}: no such file or directory"
        for _ in range(2):  # one restart, then the job fails
            launch = await leader_launch(agent, "mounty")
            await failed(agent, launch, statfs, None)

        for name in ("pathy", "mounty"):
            await it.alice.wait(name, timeout_s=30)

        async def recorded() -> bool:
            return len(await it.bob.history()) == 2

        await eventually(recorded, what="both history records")
        seen = {
            "get": [await it.bob.get("pathy"), await it.bob.get("mounty")],
            "explain": [await it.bob.explain("pathy"), await it.bob.explain("mounty")],
            "list": await it.bob.jobs(),
            "events": await it.bob.events(),
            "job events": await it.bob.events("mounty"),
            "history": await it.bob.history(),
        }
        for where, replies in seen.items():
            text = str(replies)
            for secret in secrets:
                assert secret not in text, f"{where} shows {secret!r}"
        # The messages still say what went wrong, naming where each hidden value came from.
        pathy_seen = await it.bob.get("pathy")
        assert pathy_seen.status.reason == "CommandNotFound"
        assert "(not found in PATH=(hidden env PATH))" in pathy_seen.status.leader.reason
        mounty_seen = await it.bob.get("mounty")
        assert "statfs (hidden hostPath of volume data)" in mounty_seen.status.message
        assert any("(hidden hostPath of volume data)" in e.message for e in seen["job events"])


def test_a_reason_keeps_its_kind_and_short_values() -> None:
    spec = parse_job_dict(
        job_spec("j", ["run", "CommandNotFound"], ["true"]),
        env={"MODE": "on", "KIND": "AgentStopped", "PY": "/opt/lib:/srv/x"},
    )
    # The controller reads the kind: a value the job holds never changes it.
    assert public_reason("AgentStopped", spec) == "AgentStopped"
    assert public_reason("CommandNotFound: no CommandNotFound", spec) == (
        "CommandNotFound: no (hidden argument)"
    )
    # Short values stay (they would take words out of every message); a PATH-like value goes
    # whole and by its parts, the longest first, in one pass.
    assert Hidden.of(spec).scrub("on /opt/lib:/srv/x and /opt/lib/a") == (
        "on (hidden env PY) and (hidden env PY)/a"
    )
    # A reason full of a short value does not grow without bound.
    flood = public_reason("StartError: " + "/srv/x" * 600, spec)  # 3612 characters
    assert len(flood) == REASON_CHARS and flood.endswith("…") and "/srv/x" not in flood


def parse_job_dict(body: dict[str, object], env: dict[str, str]) -> JobSpec:
    body["spec"]["leader"]["template"]["env"] = env  # type: ignore[index]
    return parse_job(load_job_data(body))


def test_system_directories_and_words_inside_others_are_left_as_they_are() -> None:
    spec = parse_job_dict(
        job_spec("j", ["run"], ["true"]),
        env={
            "PATH": "/usr/local/bin:/usr/bin:/bin:/home/alice/private-tools",
            "MODE": "direct",
            "TOKEN": "hunter2hunter2",
        },
    )
    reason = "CommandNotFound: cannot start `/usr/bin/python3`: No such file or directory"
    assert public_reason(reason, spec) == reason  # "direct" is no word here; /usr/bin everyone's
    assert public_reason("StartError: /home/alice/private-tools/x: denied", spec) == (
        "StartError: (hidden env PATH)/x: denied"
    )
    assert public_reason("StartError: key hunter2hunter2 refused", spec) == (
        "StartError: key (hidden env TOKEN) refused"
    )
    # A job's values are gathered once: reasons in a burst, or reads by others, reuse them.
    assert Hidden.of(spec) is Hidden.of(spec)
