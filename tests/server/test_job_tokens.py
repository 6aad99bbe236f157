"""Job tokens attacked through the real API, as a hostile program in a pod would: a TLS server
with real user tokens (and an insecure one), the token sent as `authorization: Bearer` metadata.

A job token reaches its own job only (GetJob, WatchJobs, ScaleJob, ConfirmCheckpoint,
ReportValues), and a sweep member's its own experiment (GetExperiment, GetReports), is
refused UNAUTHENTICATED when forged or once its job ended (its streams end then), survives a
server restart on the same store, and shows in no reply, event or log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from arranger.client.messages import as_job
from arranger.server import tokens
from arranger.server.app import ArrangerServer
from arranger.server.job_tokens import JobTokens
from arranger.v1 import agent_pb2, agent_pb2_grpc, arranger_pb2, arranger_pb2_grpc
from tests.conftest import FAST, bare_server, eventually, job_spec
from tests.server.test_auth import issue, secured

ALLOWED = (
    "a job token may call only ConfirmCheckpoint, GetExperiment, GetJob, GetReports, "
    "ReportValues, ScaleJob, WatchJobs"
)
OWN_ONLY = "a job token reaches its own job only"
OWN_EXPERIMENT_ONLY = "a job token reaches its own job's experiment only"
Refused = grpc.aio.AioRpcError


class Caller:
    """Caller: raw calls to a server's API with `token` as `authorization: Bearer` metadata
    (over TLS trusting `ca`, or plain)."""

    def __init__(self, address: str, token: str, ca: bytes | None = None) -> None:
        if ca is None:
            self.channel = grpc.aio.insecure_channel(address)
        else:
            self.channel = grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(ca))
        self.api = arranger_pb2_grpc.ArrangerStub(self.channel)
        self.agent = agent_pb2_grpc.AgentServiceStub(self.channel)
        self.metadata = (("authorization", f"Bearer {token}"),)

    async def __aenter__(self) -> Caller:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()

    async def get(self, name: str) -> Any:
        return await self.api.GetJob(
            arranger_pb2.GetJobRequest(name=name), metadata=self.metadata, timeout=10
        )

    def watch(self, name: str) -> Any:
        return self.api.WatchJobs(
            arranger_pb2.WatchJobsRequest(name=name), metadata=self.metadata, timeout=30
        )

    async def scale(self, name: str, counts: int) -> Any:
        request = arranger_pb2.ScaleJobRequest(name=name, worker_set="actors", counts=counts)
        return await self.api.ScaleJob(request, metadata=self.metadata, timeout=10)

    async def checkpointed(self, name: str) -> Any:
        request = arranger_pb2.ConfirmCheckpointRequest(name=name)
        return await self.api.ConfirmCheckpoint(request, metadata=self.metadata, timeout=10)

    async def report(self, name: str, step: int = 1, note: str = "", **values: float) -> Any:
        point = arranger_pb2.ReportPoint(step=step, values=values)
        notes = {"checkpoint": note} if note else {}
        request = arranger_pb2.ReportValuesRequest(job=name, points=[point], notes=notes)
        return await self.api.ReportValues(request, metadata=self.metadata, timeout=10)

    async def reports(self, name: str) -> Any:
        request = arranger_pb2.GetReportsRequest(name=name)
        return await self.api.GetReports(request, metadata=self.metadata, timeout=10)

    async def experiment(self, name: str) -> Any:
        request = arranger_pb2.GetExperimentRequest(name=name)
        return await self.api.GetExperiment(request, metadata=self.metadata, timeout=10)

    def every_other_call(self, job: str) -> dict[str, Callable[[], Any]]:
        """every_other_call: a call of each method a job token may not make, on its own job
        where the method takes one."""
        api, agent, md = self.api, self.agent, self.metadata
        upload = arranger_pb2.UploadPackageRequest()
        queue = arranger_pb2.Queue(name="mine", weight=1)
        execute = arranger_pb2.ExecRequest(start=arranger_pb2.ExecStart(job=job, command=["id"]))
        return {
            "ListJobs": lambda: api.ListJobs(arranger_pb2.ListJobsRequest(), metadata=md),
            "SubmitJob": lambda: api.SubmitJob(arranger_pb2.SubmitJobRequest(), metadata=md),
            "StopJob": lambda: api.StopJob(arranger_pb2.StopJobRequest(name=job), metadata=md),
            "DeleteJob": lambda: api.DeleteJob(
                arranger_pb2.DeleteJobRequest(name=job), metadata=md
            ),
            "GetLogs": lambda: api.GetLogs(
                arranger_pb2.GetLogsRequest(job=job), metadata=md
            ).read(),
            "ListNodes": lambda: api.ListNodes(arranger_pb2.ListNodesRequest(), metadata=md),
            "CordonNode": lambda: api.CordonNode(
                arranger_pb2.CordonNodeRequest(name="n", cordon=True), metadata=md
            ),
            "DrainNode": lambda: api.DrainNode(
                arranger_pb2.DrainNodeRequest(name="n"), metadata=md
            ),
            "ListEvents": lambda: api.ListEvents(
                arranger_pb2.ListEventsRequest(job=job), metadata=md
            ),
            "ExplainJob": lambda: api.ExplainJob(
                arranger_pb2.ExplainJobRequest(name=job), metadata=md
            ),
            "ListQueues": lambda: api.ListQueues(arranger_pb2.ListQueuesRequest(), metadata=md),
            "CreateQueue": lambda: api.CreateQueue(
                arranger_pb2.CreateQueueRequest(queue=queue), metadata=md
            ),
            "UpdateQueue": lambda: api.UpdateQueue(
                arranger_pb2.UpdateQueueRequest(queue=queue), metadata=md
            ),
            "DeleteQueue": lambda: api.DeleteQueue(
                arranger_pb2.DeleteQueueRequest(name="default"), metadata=md
            ),
            "ListHistory": lambda: api.ListHistory(arranger_pb2.ListHistoryRequest(), metadata=md),
            "HasPackage": lambda: api.HasPackage(
                arranger_pb2.HasPackageRequest(sha256="0" * 64), metadata=md
            ),
            "UploadPackage": lambda: api.UploadPackage(iter([upload]), metadata=md),
            "ExecPod": lambda: api.ExecPod(iter([execute]), metadata=md).read(),
            "Exec": lambda: agent.Exec(iter([agent_pb2.ExecFromAgent()]), metadata=md).read(),
            "Connect": lambda: agent.Connect(iter([agent_pb2.AgentMessage()]), metadata=md).read(),
            "FetchPackage": lambda: agent.FetchPackage(
                agent_pb2.FetchPackageRequest(sha256="0" * 64), metadata=md
            ).read(),
        }


async def refused(call: Any) -> Refused:
    """refused: the error a call (awaitable) ends with; it must end with one."""
    with pytest.raises(Refused) as caught:
        await asyncio.wait_for(call, timeout=10)
    return caught.value


async def drained(stream: Any) -> list[Any]:
    """drained: what a stream yields until it ends (raising what it ends with)."""
    found = []
    while (msg := await stream.read()) is not grpc.aio.EOF:
        found.append(msg)
    return found


def elastic(name: str) -> dict[str, Any]:
    """elastic: a job whose `actors` set may grow to 3 (1 now)."""
    body = job_spec(name, ["true"], workers=1)
    body["spec"]["workerSets"][0]["maxCounts"] = 3
    body["spec"]["leader"]["template"]["env"] = {"SECRET": "s-1"}
    return body


@dataclasses.dataclass
class Lab:
    """Lab: a server, alice's jobs `a1` and `a2`, bob's `b1` (none runs: there is no agent),
    callers as alice and bob, and each job's id."""

    server: ArrangerServer
    address: str
    ca: bytes | None
    alice: Caller
    bob: Caller
    ids: dict[str, str]

    def token(self, name: str) -> str:
        return self.server.job_tokens.token(self.ids[name])

    def as_job(self, name: str) -> Caller:
        return Caller(self.address, self.token(name), self.ca)

    async def submit(self, who: Caller, name: str) -> str:
        request = arranger_pb2.SubmitJobRequest(job=as_job(elastic(name)))
        reply = await who.api.SubmitJob(request, metadata=who.metadata, timeout=10)
        self.ids[name] = reply.job.metadata.id
        return str(reply.job.metadata.id)

    async def sweep(self, who: Caller, name: str) -> None:
        """sweep submits an experiment of two members, NAME-0 and NAME-1 (lr 1 and 2), and
        keeps its id and theirs."""
        body = elastic(name)
        body["spec"]["sweep"] = {"parameters": {"lr": [1, 2]}}
        request = arranger_pb2.SubmitJobRequest(job=as_job(body))
        reply = await who.api.SubmitJob(request, metadata=who.metadata, timeout=10)
        self.ids[name] = reply.experiment.id
        for member in (await who.experiment(name)).members:
            self.ids[member.job.name] = member.job.id


# With no node at all, a job is infeasible; it must stay Pending (its token good) as long as a
# test takes, however slow the machine.
WAITING = dataclasses.replace(
    FAST, scheduler=dataclasses.replace(FAST.scheduler, infeasible_timeout_s=3600.0)
)


@contextlib.asynccontextmanager
async def tls_lab(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> AsyncIterator[Lab]:
    async with secured(tmp_path, WAITING) as cluster:
        assert cluster.server is not None
        ca = (cluster.tls / "ca.pem").read_bytes()
        alice = await issue(cluster, "alice", capsys)
        bob = await issue(cluster, "bob", capsys)
        async with Caller(cluster.address, alice, ca) as a, Caller(cluster.address, bob, ca) as b:
            it = Lab(cluster.server, cluster.address, ca, a, b, {})
            for who, name in ((a, "a1"), (a, "a2"), (b, "b1")):
                await it.submit(who, name)
            yield it


@contextlib.asynccontextmanager
async def insecure_lab(tmp_path: Path, config: Any = WAITING) -> AsyncIterator[Lab]:
    async with bare_server(tmp_path / "server", config) as server:
        address = f"127.0.0.1:{server.port}"
        async with Caller(address, "") as a, Caller(address, "") as b:
            it = Lab(server, address, None, a, b, {})
            for who, name in ((a, "a1"), (a, "a2"), (b, "b1")):
                await it.submit(who, name)
            yield it


async def confined(it: Lab) -> None:
    """confined: what a1's token may and may not do."""
    # Bob names a job after a1's id (ids are listed to every user): the id still means a1.
    await it.submit(it.bob, it.ids["a1"])
    async with it.as_job("a1") as a1:
        for name in (it.ids["a1"], "a1"):  # by id (as arranger.job does) or by name
            job = await a1.get(name)
            assert job.metadata.id == it.ids["a1"]
            assert job.spec.leader.template.env["SECRET"] == "s-1"  # its own: not redacted
        watch = a1.watch(it.ids["a1"])
        first = await watch.read()
        assert first.type == "ADDED" and first.id == it.ids["a1"]
        assert (await watch.read()).type == "SYNCED"
        shadow = await it.bob.scale(it.ids["a1"], 2)  # bob's job named like a1's id changes
        assert shadow.metadata.owner == "bob" or not it.ca
        scaled = await a1.scale(it.ids["a1"], 2)
        assert [ws.counts for ws in scaled.spec.worker_sets] == [2]
        changed = await asyncio.wait_for(watch.read(), timeout=10)
        assert changed.type == "MODIFIED" and changed.id == it.ids["a1"]
        watch.cancel()
        kept = await a1.checkpointed(it.ids["a1"])  # no notice runs: the time is kept
        assert kept.status.HasField("checkpoint_time") and kept.status.stage == "Pending"

        # Another job, the same owner's or not, by name or id, or none at all: refused.
        others = ("a2", "b1", it.ids["a2"], it.ids["b1"], it.ids[it.ids["a1"]], "no-such", "")
        for other in others:
            for call in (
                a1.get(other),
                drained(a1.watch(other)),
                a1.scale(other, 2),
                a1.checkpointed(other),
            ):
                error = await refused(call)
                assert error.code() == grpc.StatusCode.PERMISSION_DENIED, (other, error)
                assert OWN_ONLY in (error.details() or ""), error
        for method, call in a1.every_other_call("a1").items():
            error = await refused(call())
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED, (method, error)
            assert error.details() == f"{method}: {ALLOWED}, on its own job", error
    # None of it changed another job.
    for name in ("a2", "b1"):
        assert [ws.counts for ws in (await it.alice.get(name)).spec.worker_sets] == [1]
    assert (await it.alice.get("a1")).status.stage == "Pending"  # not stopped


async def test_a_job_token_reaches_its_own_job_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with tls_lab(tmp_path, capsys) as it:
        await confined(it)
        events = await it.alice.api.ListEvents(
            arranger_pb2.ListEventsRequest(job="a1"), metadata=it.alice.metadata
        )
        assert any("job token of a1" in e.message for e in events.events), events


async def test_the_same_holds_on_an_insecure_server(tmp_path: Path) -> None:
    async with insecure_lab(tmp_path) as it:
        await confined(it)
        # A token that is none of the server's is refused, not taken as the local admin.
        forged = it.token("a1")[:-2] + "xx"
        async with Caller(it.address, forged) as fake:
            error = await refused(
                fake.api.ListJobs(arranger_pb2.ListJobsRequest(), metadata=fake.metadata)
            )
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED


def forgeries(it: Lab) -> dict[str, str]:
    """forgeries: tokens a hostile user could make of what they see (job ids are listed to
    every user) and of one token of their own."""
    good = it.token("a1")
    prefix = f"arj_{it.ids['a1']}"
    mac = good.removeprefix(prefix + "_")
    flipped = mac[:-1] + ("A" if mac[-1] != "A" else "B")
    stranger = JobTokens(lambda job_id: None)
    stranger.open(secrets.token_hex(32), it.address, None)
    return {
        "wrong mac": f"{prefix}_{flipped}",
        "another job's id with this job's mac": f"arj_{it.ids['a2']}_{mac}",
        "truncated": good[:-1],
        "mac left out": f"{prefix}_",
        "id left out": f"arj__{mac}",
        "another cluster's": stranger.token(it.ids["a1"]),
        "garbage after the prefix": "arj_" + "%$#!" * 8,
        "only the prefix": "arj_",
        "underscores": "arj_" + "_" * 64,
        "the mac twice": f"{good}_{mac}",
        "a user token's prefix": "arr_" + good[4:],
        "upper case": good.upper(),
        "large": f"arj_{it.ids['a1']}{'0' * 6000}_{mac}",
    }


async def test_forged_job_tokens_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with tls_lab(tmp_path, capsys) as it:
        for what, token in forgeries(it).items():
            async with Caller(it.address, token, it.ca) as forger:
                for call in (forger.get(it.ids["a1"]), drained(forger.watch(it.ids["a1"]))):
                    error = await refused(call)
                    assert error.code() == grpc.StatusCode.UNAUTHENTICATED, (what, error)
        # Metadata beyond gRPC's limit never reaches the server's code.
        async with Caller(it.address, "arj_" + "a" * 100_000, it.ca) as huge:
            error = await refused(huge.get(it.ids["a1"]))
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error


def test_the_token_of_every_job_is_accepted() -> None:
    """Whatever characters its mac holds (base64url has `_` and `-`), a job's token names it."""
    jobs = {secrets.token_hex(6): SimpleNamespace(active=True, owner="alice") for _ in range(300)}
    tokens = JobTokens(jobs.get)  # type: ignore[arg-type]
    tokens.open(secrets.token_hex(32), "127.0.0.1:1", None)
    for job_id in jobs:
        principal = tokens.identify(tokens.token(job_id))
        assert principal is not None and principal.job == job_id, tokens.token(job_id)
        assert principal.user == "alice" and principal.kind == "job" and not principal.admin


def test_checking_a_token_costs_the_same_whatever_it_holds() -> None:
    """A token of any size or content is checked in bounded time, without an exception."""
    jobs: dict[str, Any] = {}
    tokens = JobTokens(jobs.get)
    tokens.open(secrets.token_hex(32), "127.0.0.1:1", None)
    mac = tokens.token("abc").removeprefix("arj_abc_")
    for token in (
        "arj_abc_" + mac[:-1] + "\u00e9",
        "arj_\u00e9_" + mac,
        "arj_abc_\x00",
        "arj_" + "\ud800",
        "arj_" + "a" * 50_000_000 + "_" + mac,
        "arj_" + "_" * 1_000_000,
    ):
        started = time.perf_counter()
        assert tokens.identify(token) is None
        assert time.perf_counter() - started < 0.05, len(token)


async def test_a_job_token_ends_with_its_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stopped (it finishes) or deleted: its token is refused and the streams it opened end;
    the tokens of the owner's other jobs still work."""
    async with tls_lab(tmp_path, capsys) as it, contextlib.AsyncExitStack() as stack:
        await it.submit(it.alice, "a3")
        callers = {
            name: await stack.enter_async_context(it.as_job(name)) for name in ("a1", "a2", "a3")
        }
        watches = {name: c.watch(it.ids[name]) for name, c in callers.items()}
        for watch in watches.values():
            assert [(await watch.read()).type for _ in range(2)] == ["ADDED", "SYNCED"]
        md = it.alice.metadata
        await it.alice.api.StopJob(arranger_pb2.StopJobRequest(name="a1"), metadata=md)
        await it.alice.api.DeleteJob(arranger_pb2.DeleteJobRequest(name="a2"), metadata=md)
        for name in ("a1", "a2"):
            error = await refused(drained(watches[name]))
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED, (name, error)
            job = it.ids[name]
            for call in (callers[name].get(job), drained(callers[name].watch(job))):
                error = await refused(call)
                assert error.code() == grpc.StatusCode.UNAUTHENTICATED, (name, error)
                assert "job token's job has ended" in (error.details() or "")
        assert (await callers["a3"].get("a3")).metadata.name == "a3"
        watches["a3"].cancel()


async def test_a_job_tokens_stream_outlives_the_check_of_user_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store knows user tokens only: the check that ends the streams of revoked ones
    leaves a live job's streams open."""
    monkeypatch.setattr(tokens, "REVOCATION_CHECK_S", 0.02)
    async with tls_lab(tmp_path, capsys) as it:
        checks = [0]
        check = it.server.tokens._check

        async def counted() -> None:
            await check()
            checks[0] += 1

        monkeypatch.setattr(it.server.tokens, "_check", counted)
        async with it.as_job("a1") as a1:
            watch = a1.watch(it.ids["a1"])
            assert [(await watch.read()).type for _ in range(2)] == ["ADDED", "SYNCED"]
            seen = checks[0]
            await eventually(lambda: checks[0] >= seen + 3, what="three checks of user tokens")
            await a1.scale(it.ids["a1"], 2)
            assert (await asyncio.wait_for(watch.read(), timeout=10)).type == "MODIFIED"
            watch.cancel()


async def test_a_restarted_server_accepts_the_tokens_of_live_jobs(
    tmp_path: Path, store_url: str
) -> None:
    """The key is in the store (SQLite or PostgreSQL): a server started again on it, or
    another server of the cluster, checks the tokens the pods of live jobs hold."""
    config = dataclasses.replace(WAITING, store=store_url)
    async with insecure_lab(tmp_path, config) as it:
        token, a1 = it.token("a1"), it.ids["a1"]
        forged = forgeries(it)["another job's id with this job's mac"]
    async with bare_server(tmp_path / "again", config) as server:
        assert server.job_tokens.token(a1) == token
        address = f"127.0.0.1:{server.port}"
        async with Caller(address, token) as again, Caller(address, forged) as forger:
            assert (await again.get(a1)).metadata.name == "a1"
            error = await refused(again.get("b1"))
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED
            error = await refused(forger.get(a1))
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_a_members_token_reads_its_experiment_and_reports_for_its_own_job_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A token of member ea-0 reports for ea-0 and reads the experiment ea whole, its peer's
    reports among it; it reaches no other experiment (alice's own ez, bob's eb) and no report
    of a job outside ea, and reports for no other job, ea's other member included. A token of
    a job that is no member (a1) reads no experiment."""
    async with tls_lab(tmp_path, capsys) as it, contextlib.AsyncExitStack() as stack:
        await it.sweep(it.alice, "ea")
        await it.sweep(it.alice, "ez")
        await it.sweep(it.bob, "eb")
        ea0, ea1, a1 = [
            await stack.enter_async_context(it.as_job(name)) for name in ("ea-0", "ea-1", "a1")
        ]
        await ea0.report("ea-0", loss=0.5, note="/ckpt/0")  # by name
        await ea1.report(it.ids["ea-1"], step=3, loss=0.25, note="/ckpt/1")  # by id
        for name in ("ea", it.ids["ea"]):
            exp = await ea0.experiment(name)
            assert exp.summary.name == "ea" and exp.spec.leader.template.env["SECRET"] == "s-1"
            seen = {
                m.job.name: (dict(m.values), m.step, dict(m.latest), dict(m.notes))
                for m in exp.members
            }
            assert seen == {
                "ea-0": ({"lr": "1", "seed": "0"}, 1, {"loss": 0.5}, {"checkpoint": "/ckpt/0"}),
                "ea-1": ({"lr": "2", "seed": "0"}, 3, {"loss": 0.25}, {"checkpoint": "/ckpt/1"}),
            }
        for name in ("ea", it.ids["ea"]):  # its peers' reports, through the experiment
            reports = await ea0.reports(name)
            got = {
                r.job: [(s.key, list(s.steps), list(s.values)) for s in r.series]
                for r in reports.jobs
            }
            assert got == {"ea-0": [("loss", [1], [0.5])], "ea-1": [("loss", [3], [0.25])]}
        for name in ("ea-0", it.ids["ea-0"]):  # its own job's
            assert [r.job for r in (await ea0.reports(name)).jobs] == ["ea-0"]
        for name in ("ea-1", it.ids["ea-1"]):  # a peer's, by its name or id
            assert [r.job for r in (await ea0.reports(name)).jobs] == ["ea-1"]

        # Another experiment, the same owner's or not, by name or id; a job outside its
        # experiment; reports for another job, its own experiment's included: refused.
        outside = ("ez", "eb", it.ids["ez"], it.ids["eb"], "ez-0", "eb-0", it.ids["eb-0"])
        calls = [ea0.experiment(name) for name in (*outside, "a1", "no-such", "")]
        calls += [ea0.reports(name) for name in (*outside, "a1", it.ids["b1"], "no-such", "")]
        for call in calls:
            error = await refused(call)
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error
            assert OWN_EXPERIMENT_ONLY in (error.details() or ""), error
        for name in ("ea-1", it.ids["ea-1"], "ez-0", "eb-0", "a1", "no-such", ""):
            error = await refused(ea0.report(name, loss=9.0))
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED, (name, error)
            assert OWN_ONLY in (error.details() or ""), error
        # A job that is no member reads no experiment, its owner's neither.
        for name in ("ea", it.ids["ea"], "a1", ""):
            error = await refused(a1.experiment(name))
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED, (name, error)
            assert OWN_EXPERIMENT_ONLY in (error.details() or ""), error

        # None of it changed another job's reports.
        theirs = await it.alice.reports("ea-1")
        assert [(s.key, list(s.values)) for r in theirs.jobs for s in r.series] == [
            ("loss", [0.25])
        ]
        for name in ("a1", "ez", "eb-0"):
            owner = it.bob if name.startswith("eb") else it.alice
            assert [r.series for r in (await owner.reports(name)).jobs if r.series] == []
