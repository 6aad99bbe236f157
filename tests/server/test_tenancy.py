"""Many users on one cluster, through the real API: a TLS server, real tokens made with the CLI.

Users act on their own jobs and read the rest with secrets redacted; nodes and queues are for
admins; queues, host paths, the environment and per-user limits refuse what they must, naming
the field or the limit; a revoked token's open streams end at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from arranger.client.sdk import ArrangerError, AsyncClient
from arranger.server.access import REDACTED, SubmitPolicy
from arranger.server.config import INSECURE_LISTEN, load_server_config
from arranger.server.limits import UserLimits
from arranger.server.store import on_store, sqlite_url
from arranger.v1 import arranger_pb2
from tests.conftest import eventually, job_spec
from tests.server.test_auth import Secured, in_thread, issue, secured


@dataclasses.dataclass
class Lab:
    cluster: Secured
    alice: AsyncClient
    bob: AsyncClient
    admin: AsyncClient
    tokens: dict[str, str]


@contextlib.asynccontextmanager
async def lab(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], **changes: object
) -> AsyncIterator[Lab]:
    """lab: a TLS server with allowedHostPaths [tmp_path], and tokens for alice, bob (users)
    and root (admin)."""
    changes.setdefault("policy", SubmitPolicy(allowed_host_paths=(str(tmp_path),)))
    async with secured(tmp_path, **changes) as cluster:
        tokens = {
            "alice": await issue(cluster, "alice", capsys),
            "bob": await issue(cluster, "bob", capsys),
            "root": await issue(cluster, "root", capsys, role="admin"),
        }
        ca = cluster.tls / "ca.pem"
        async with (
            AsyncClient(cluster.address, ca=ca, token=tokens["alice"], timeout_s=10) as alice,
            AsyncClient(cluster.address, ca=ca, token=tokens["bob"], timeout_s=10) as bob,
            AsyncClient(cluster.address, ca=ca, token=tokens["root"], timeout_s=10) as admin,
        ):
            yield Lab(cluster, alice, bob, admin, tokens)


def secret_job(name: str, tmp_path: Path) -> dict[str, object]:
    spec = job_spec(
        name,
        ["python", "train.py", "--wandb-key", "k-123"],
        volumes=[{"name": "data", "hostPath": str(tmp_path), "mountPath": "/data"}],
    )
    spec["spec"]["leader"]["template"]["env"] = {"WANDB_API_KEY": "secret-1"}  # type: ignore[index]
    spec["spec"]["leader"]["template"]["args"] = ["--lr", "3e-4"]  # type: ignore[index]
    return spec


async def refusal(call: object) -> ArrangerError:
    with pytest.raises(ArrangerError) as refused:
        await call  # type: ignore[misc]
    return refused.value


async def test_users_act_on_their_own_jobs_and_see_others_redacted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with lab(tmp_path, capsys) as it:
        mine = await it.alice.submit(secret_job("alices", tmp_path))
        assert mine.metadata.owner == "alice"
        assert mine.spec.leader.template.env["WANDB_API_KEY"] == "secret-1"

        seen = await it.bob.get("alices")  # visible: stage, queue, resources, owner
        assert seen.metadata.owner == "alice" and seen.status.stage == "Pending"
        assert seen.spec.leader.template.resources.cpu == pytest.approx(0.1)
        template = seen.spec.leader.template
        assert dict(template.env) == {"WANDB_API_KEY": REDACTED}
        assert list(template.command) == ["python", REDACTED] and list(template.args) == [REDACTED]
        assert seen.spec.volumes[0].host_path == REDACTED
        explained = await it.bob.explain("alices")
        assert explained.job.spec.leader.template.env["WANDB_API_KEY"] == REDACTED
        listed = await it.bob.jobs()
        assert "secret-1" not in str(listed) and "k-123" not in str(listed)

        for call, what in (
            (it.bob.stop("alices"), "stop job 'alices'"),
            (it.bob.delete("alices"), "delete job 'alices'"),
        ):
            refused = await refusal(call)
            assert refused.code == grpc.StatusCode.PERMISSION_DENIED
            assert what in refused.message and "belongs to 'alice'" in refused.message
        logs = it.bob.logs("alices")
        refused = await refusal(anext(logs))
        assert refused.code == grpc.StatusCode.PERMISSION_DENIED and "logs" in refused.message

        # The owner and an admin may.
        assert (await it.admin.get("alices")).spec.leader.template.env[
            "WANDB_API_KEY"
        ] == "secret-1"
        await it.alice.stop("alices")
        await it.bob.submit(job_spec("bobs", ["true"]))
        await it.admin.delete("bobs")


async def test_nodes_and_queues_are_for_admins(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with lab(tmp_path, capsys) as it:
        queue = arranger_pb2.Queue(name="rl", weight=2)
        for call in (
            it.bob.cordon("node-a"),
            it.bob.drain("node-a"),
            it.bob.create_queue(queue),
            it.bob.update_queue(arranger_pb2.Queue(name="default", weight=5)),
            it.bob.delete_queue("default"),
        ):
            refused = await refusal(call)
            assert refused.code == grpc.StatusCode.PERMISSION_DENIED, refused
            assert "needs the admin role; user 'bob' has the user role" in refused.message
        await it.admin.create_queue(queue)
        assert "rl" in {q.name for q in await it.bob.queues()}  # reading is for everyone
        refused = await refusal(it.admin.cordon("node-a"))
        assert refused.code == grpc.StatusCode.NOT_FOUND  # admins get past the role check


async def test_queues_say_who_may_submit_and_how(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with lab(tmp_path, capsys) as it:
        await it.admin.create_queue(
            arranger_pb2.Queue(name="team-a", users=["alice"], max_priority=6)
        )

        def job(name: str, **spec: object) -> dict[str, object]:
            body = job_spec(name, ["true"], **spec)
            body["metadata"]["queue"] = "team-a"  # type: ignore[index]
            return body

        cases = [
            (it.bob, job("b1"), "metadata.queue: user 'bob' may not submit to queue 'team-a'"),
            (
                it.alice,
                job("a1", priority=9),
                "spec.priority: 9 is above the maximum priority of queue 'team-a': 6",
            ),
            (
                it.alice,
                job("a2", priority=6, preemptible=False),
                "spec.preemptible: queue 'team-a' does not allow non-preemptible jobs",
            ),
        ]
        for client, body, message in cases:
            refused = await refusal(client.submit(body))
            assert refused.code == grpc.StatusCode.PERMISSION_DENIED
            assert message in refused.message
        await it.alice.submit(job("a3", priority=6))
        await it.admin.submit(job("admins", priority=10, preemptible=False))  # admins may
        listed = {q.name: q for q in await it.bob.queues()}
        assert list(listed["team-a"].users) == ["alice"] and listed["team-a"].max_priority == 6


async def test_host_paths_and_loader_variables_are_refused_by_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with lab(tmp_path, capsys) as it:
        for host_path, message in (
            ("/etc", "is not under an allowed prefix (allowedHostPaths: "),
            (f"{tmp_path}/./x", "must be a normalised absolute path"),
            (f"{tmp_path}-other", "is not under an allowed prefix"),
        ):
            body = job_spec("vol", ["true"], volumes=[{"name": "d", "hostPath": host_path}])
            refused = await refusal(it.alice.submit(body))
            assert refused.code == grpc.StatusCode.PERMISSION_DENIED
            assert f"spec.volumes[0].hostPath: {host_path!r} {message}" in refused.message
        await it.alice.submit(
            job_spec("vol", ["true"], volumes=[{"name": "d", "hostPath": f"{tmp_path}/sub"}])
        )
        for name in ("LD_PRELOAD", "LD_AUDIT", "GCONV_PATH", "BASH_ENV", "ENV", "IFS"):
            body = job_spec("env", ["true"])
            body["spec"]["workerSets"][0]["template"]["env"] = {name: "/tmp/x"}  # type: ignore[index]
            refused = await refusal(it.admin.submit(body))
            assert refused.code == grpc.StatusCode.PERMISSION_DENIED
            assert f"spec.workerSets[0].template.env.{name}: may not be set (deniedEnv)" in (
                refused.message
            )
        body = job_spec("env", ["true"])
        body["spec"]["leader"]["template"]["env"] = {"LD_LIBRARY_PATH": "/opt/cuda/lib64"}  # type: ignore[index]
        await it.alice.submit(body)  # CUDA and conda jobs need it


async def test_per_user_limits_name_the_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    limits = UserLimits(
        jobs_per_user=2,
        pods_per_user=5,
        submits_per_s=0.001,
        submit_burst=3,
        spec_bytes=32 * 1024,
        streams_per_user=2,
    )
    async with lab(tmp_path, capsys, limits=limits) as it:

        async def refused_with(client: AsyncClient, body: dict[str, object], limit: str) -> None:
            refused = await refusal(client.submit(body))
            assert refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED, refused
            assert refused.message.startswith(limit), refused.message

        big = job_spec("big", ["true"])
        big["spec"]["leader"]["template"]["env"] = {"BLOB": "x" * 40_000}  # type: ignore[index]
        await refused_with(it.alice, big, "limits.specBytes: the job's spec is ")
        await refused_with(it.alice, job_spec("wide", ["true"], workers=5), "limits.podsPerUser")
        await it.alice.submit(job_spec("a0", ["true"]))  # 2 pods each
        await it.alice.submit(job_spec("a1", ["true"]))
        await refused_with(it.alice, job_spec("a2", ["true"]), "limits.jobsPerUser")
        await it.alice.delete("a0")  # a deleted job no longer counts
        await refused_with(it.alice, job_spec("a2", ["true"], workers=3), "limits.podsPerUser")
        await it.alice.submit(job_spec("a2", ["true"]))
        await it.alice.delete("a1")
        await refused_with(it.alice, job_spec("a3", ["true"]), "limits.submitsPerSecond")
        # Bob's budget is his own; admins are not rate limited.
        await it.bob.submit(job_spec("b0", ["true"]))
        for i in range(4):
            await it.admin.submit(job_spec(f"r{i}", ["true"]))
            if i:
                await it.admin.delete(f"r{i - 1}")

        # Open streams: two watches are the limit; a third is refused until one ends.
        first, second = it.bob.watch("b0"), it.bob.watch("b0")
        await anext(first)
        await anext(second)
        refused = await refusal(anext(it.bob.watch("b0")))
        assert refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "maxStreamsPerUser 2" in refused.message
        await anext(it.alice.watch("b0"))  # another user's streams are not counted with his
        await first.aclose()

        async def third_opens() -> bool:
            try:
                await anext(it.bob.watch("b0"))
            except ArrangerError:
                return False
            return True

        await eventually(third_opens, timeout_s=10, what="a stream slot to free up")
        await second.aclose()


async def test_a_revoked_token_ends_its_open_streams(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with lab(tmp_path, capsys) as it:
        await it.alice.submit(job_spec("watched", ["true"]))
        watch = it.alice.watch("watched")
        await anext(watch)
        others = it.bob.watch("watched")
        await anext(others)
        data_dir = str(it.cluster.data_dir)
        assert await in_thread("token", "delete", "alice", "--data-dir", data_dir) == 0

        async def drain() -> None:
            async for _ in watch:  # news of the job may still come before the end
                pass

        refused = await refusal(asyncio.wait_for(drain(), timeout=5))
        assert refused.code == grpc.StatusCode.UNAUTHENTICATED
        assert "revoked" in refused.message
        refused = await refusal(it.alice.jobs())
        assert refused.code == grpc.StatusCode.UNAUTHENTICATED
        assert (await it.bob.get("watched")).metadata.owner == "alice"  # bob's token still works
        await others.aclose()


async def test_the_store_is_private_to_the_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with lab(tmp_path, capsys) as it:
        await it.alice.submit(secret_job("private", tmp_path))
        data = it.cluster.data_dir
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
        files = [p for p in data.iterdir() if p.name.startswith("arranger.db")]
        assert {p.name for p in files} >= {"arranger.db", "arranger.db-wal"}
        for path in files:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path

        async def last_use() -> dict[str, float | None]:
            tokens = await asyncio.to_thread(
                on_store, sqlite_url(data / "arranger.db"), lambda store: store.list_tokens()
            )  # as `arranger token list` would, from another process
            return {t.user: t.last_used for t in tokens}

        async def alice_used() -> float | None:
            return (await last_use())["alice"]

        await eventually(alice_used, timeout_s=10, what="alice's last use")
        assert (await last_use())["bob"] is None  # bob never called


def test_an_insecure_server_listens_on_loopback_unless_told(tmp_path: Path) -> None:
    assert load_server_config(None, insecure=True).listen == INSECURE_LISTEN
    told = load_server_config(None, insecure=True, listen="0.0.0.0:6000")
    assert told.listen == "0.0.0.0:6000"
    config = tmp_path / "server.yaml"
    config.write_text("insecure: true\nlisten: 10.0.0.1:7000\n")
    assert load_server_config(config).listen == "10.0.0.1:7000"
