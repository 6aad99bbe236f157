"""WatchJobs on a real server over gRPC: summaries, then changes; resuming with a token gets
exactly what was missed; a token the server no longer honours is refused; nothing private of
another user's job is ever sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from arranger.client.sdk import ArrangerError, AsyncClient, WatchExpired
from arranger.server import app
from arranger.server.access import SubmitPolicy
from arranger.server.app import ArrangerServer
from arranger.server.watch import MAX_BACKLOG, WatchHub
from arranger.v1 import arranger_pb2
from tests.conftest import FAST, bare_server, eventually, job_spec
from tests.server.test_auth import issue, secured

Events = list[arranger_pb2.WatchJobsResponse]


class Recorder:
    """Recorder keeps every message of one watch, as it arrives."""

    def __init__(self, client: AsyncClient, name: str = "", token: str = "") -> None:
        self.events: Events = []
        self._task = asyncio.create_task(self._run(client, name, token))

    async def _run(self, client: AsyncClient, name: str, token: str) -> None:
        async for event in client.watch(name, token):
            self.events.append(event)

    async def until(self, check: Callable[[Events], bool], what: str) -> None:
        await eventually(lambda: self._task.done() or check(self.events), what=what)
        if self._task.done():
            self._task.result()  # the watch ended: say why
        assert check(self.events), what

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def synced(events: Events) -> bool:
    return any(e.type == "SYNCED" for e in events)


def added(name: str) -> Callable[[Events], bool]:
    return lambda events: any(e.type == "ADDED" and e.name == name for e in events)


def seq(token: str) -> int:
    return int(token.split("/")[1])


def changes_after(events: Events, token: str, through: str) -> list[bytes]:
    """changes_after: the changes (not the initial listing) after the token's, through the
    ADDED of job `through`, as bytes."""
    out = []
    for event in events:
        if event.resume_token.count("/") == 1 and seq(event.resume_token) > seq(token):
            out.append(event.SerializeToString())
            if event.type == "ADDED" and event.name == through:
                return out
    raise AssertionError(f"no ADDED of {through}")


async def test_a_resumed_watch_gets_exactly_the_changes_it_missed(tmp_path: Path) -> None:
    async with bare_server(tmp_path) as server, AsyncClient(f"127.0.0.1:{server.port}") as client:
        await client.submit(job_spec("one", ["true"]))
        live = Recorder(client)  # never interrupted: what the others are compared with
        early = Recorder(client)
        await early.until(synced, "the initial listing")
        assert [e.type for e in early.events[:2]] == ["ADDED", "SYNCED"]
        assert early.events[0].summary.name == "one" and early.events[0].summary.owner
        token = early.events[-1].resume_token
        await early.close()

        await client.submit(job_spec("two", ["true"]))
        await client.stop("one")
        await client.delete("two")
        await live.until(
            lambda ev: any(e.type == "DELETED" and e.name == "two" for e in ev), "two deleted"
        )
        resumed = Recorder(client, token=token)
        await client.submit(job_spec("three", ["true"]))
        await live.until(added("three"), "three in the live watch")
        await resumed.until(added("three"), "three in the resumed watch")
        missed = changes_after(live.events, token, "three")
        assert [e.SerializeToString() for e in resumed.events[: len(missed)]] == missed
        got = [arranger_pb2.WatchJobsResponse.FromString(m) for m in missed]
        assert ("ADDED", "two") in [(e.type, e.name) for e in got]
        stopped = [e for e in got if e.name == "one" and e.progress.stage == "Succeeded"]
        assert stopped and {p.state for p in stopped[0].pods} == {"Killed"}
        assert [e.type for e in got if e.name == "two"][-1] == "DELETED"
        assert all(not e.HasField("summary") for e in got if e.type == "MODIFIED")
        for recorder in (live, resumed):
            await recorder.close()


async def test_a_watch_from_a_listings_token_sends_the_changes_since_the_listing(
    tmp_path: Path,
) -> None:
    async with bare_server(tmp_path) as server, AsyncClient(f"127.0.0.1:{server.port}") as client:
        await client.submit(job_spec("listed", ["true"]))
        live = Recorder(client)
        await live.until(synced, "the initial listing")
        jobs, token = await client.jobs_to_watch()
        assert [j.name for j in jobs] == ["listed"]
        await client.submit(job_spec("later", ["true"]))
        await client.stop("listed")
        watch = Recorder(client, token=token)
        await client.submit(job_spec("marker", ["true"]))
        await watch.until(added("marker"), "the marker in the watch")
        await live.until(added("marker"), "the marker in the live watch")
        missed = changes_after(live.events, token, "marker")
        assert [e.SerializeToString() for e in watch.events[: len(missed)]] == missed
        assert ("ADDED", "later") in [(e.type, e.name) for e in watch.events]
        assert not synced(watch.events)  # no initial listing: the client has one
        for recorder in (live, watch):
            await recorder.close()


async def test_a_watch_cut_off_in_its_initial_listing_goes_on_where_it_stopped(
    tmp_path: Path,
) -> None:
    async with bare_server(tmp_path) as server, AsyncClient(f"127.0.0.1:{server.port}") as client:
        for name in "abcd":
            await client.submit(job_spec(name, ["true"]))
        live = Recorder(client)
        await live.until(synced, "the initial listing")
        assert [e.name for e in live.events[:4]] == list("abcd")
        token = live.events[1].resume_token  # as if cut off after b's ADDED
        await client.submit(job_spec("e", ["true"]))
        await client.stop("c")
        await live.until(added("e"), "e submitted")
        resumed = Recorder(client, token=token)
        await client.submit(job_spec("f", ["true"]))
        await resumed.until(added("f"), "f in the resumed watch")
        await live.until(added("f"), "f in the live watch")
        listing = resumed.events[: [e.type for e in resumed.events].index("SYNCED") + 1]
        assert [(e.type, e.name) for e in listing] == [
            ("ADDED", "c"),
            ("ADDED", "d"),
            ("SYNCED", ""),
        ]
        assert listing[0].summary.progress.stage == "Succeeded"  # as it is when sent
        missed = changes_after(live.events, listing[-1].resume_token, "f")
        rest = resumed.events[len(listing) :]
        assert [e.SerializeToString() for e in rest[: len(missed)]] == missed
        assert ("ADDED", "e") in [(e.type, e.name) for e in rest]
        for recorder in (live, resumed):
            await recorder.close()


async def test_a_token_the_server_no_longer_holds_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app, "WatchHub", lambda: WatchHub(ring_changes=8))
    server = ArrangerServer(dataclasses.replace(FAST, listen="127.0.0.1:0", data_dir=tmp_path))
    async with (
        bare_server(tmp_path, server=server),
        AsyncClient(f"127.0.0.1:{server.port}") as client,
    ):
        live = Recorder(client)
        await live.until(synced, "the initial listing")
        epoch = server.watch.epoch
        for bad in ("nonsense", f"{epoch}/x", f"{epoch}/99999", "0badc0de/0", f"{epoch}/0/a/b"):
            with pytest.raises(WatchExpired) as refused:
                await anext(client.watch(resume_token=bad))
            assert refused.value.message.startswith("resumeToken: ")
        await client.submit(job_spec("first", ["true"]))
        await live.until(added("first"), "first")
        old = next(e for e in live.events if e.name == "first").resume_token
        for i in range(9):  # more changes than the ring keeps
            await client.submit(job_spec(f"more-{i}", ["true"]))
        await live.until(added("more-8"), "the last of them")
        with pytest.raises(WatchExpired):
            await anext(client.watch(resume_token=old))
        recent = live.events[-1].resume_token
        resumed = Recorder(client, token=recent)
        await client.submit(job_spec("marker", ["true"]))
        await resumed.until(added("marker"), "the marker in the resumed watch")
        await live.until(added("marker"), "the marker in the live watch")
        missed = changes_after(live.events, recent, "marker")
        assert [e.SerializeToString() for e in resumed.events[: len(missed)]] == missed
        for recorder in (live, resumed):
            await recorder.close()
    async with bare_server(tmp_path) as again, AsyncClient(f"127.0.0.1:{again.port}") as client:
        with pytest.raises(WatchExpired):  # the same store, a new run: its changes are gone
            await anext(client.watch(resume_token=recent))


async def test_summaries_and_changes_of_another_users_job_hide_nothing_private_because_they_hold_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret_dir = tmp_path / "s3cret-dir"
    secret_dir.mkdir()
    policy = SubmitPolicy(allowed_host_paths=(str(tmp_path),))
    async with secured(tmp_path, dataclasses.replace(FAST, policy=policy)) as cluster:
        ca = cluster.tls / "ca.pem"
        alice_token = await issue(cluster, "alice", capsys)
        bob_token = await issue(cluster, "bob", capsys)
        async with (
            AsyncClient(cluster.address, ca=ca, token=alice_token) as alice,
            AsyncClient(cluster.address, ca=ca, token=bob_token) as bob,
        ):
            before = Recorder(bob)  # sees the job ADDED as it is submitted
            await before.until(synced, "bob's watch")
            spec = job_spec("private", ["python", "train.py", "--password=s3cret-arg"])
            spec["spec"]["leader"]["template"]["env"] = {"API_KEY": "s3cret-env"}
            spec["spec"]["leader"]["template"]["args"] = ["--key", "s3cret-args"]
            spec["spec"]["volumes"] = [
                {"name": "data", "hostPath": str(secret_dir), "mountPath": "/data"}
            ]
            await alice.submit(spec)
            assert b"s3cret" in (await alice.get("private")).SerializeToString()
            assert b"s3cret" not in (await bob.get("private")).SerializeToString()  # redacted

            after = Recorder(bob)  # sees it in its initial listing
            await after.until(synced, "bob's second watch")
            await alice.stop("private")
            done = lambda ev: any(  # noqa: E731
                e.type == "MODIFIED" and e.progress.stage == "Succeeded" for e in ev
            )
            await before.until(done, "the job's end")
            await after.until(done, "the job's end")
            sent = [e for r in (before, after) for e in r.events]
            assert {e.type for e in sent} == {"ADDED", "SYNCED", "MODIFIED"}
            assert any(e.pods for e in sent)
            assert all(b"s3cret" not in e.SerializeToString() for e in sent)
            listed = await bob.jobs()
            assert [(j.name, j.owner) for j in listed] == [("private", "alice")]
            assert b"s3cret" not in b"".join(j.SerializeToString() for j in listed)
            assert await bob.jobs(mine=True) == [] and len(await bob.jobs(owner="alice")) == 1
            for recorder in (before, after):
                await recorder.close()


def test_the_ring_keeps_the_latest_changes_by_count_and_by_bytes() -> None:
    hub = WatchHub(ring_changes=3, ring_bytes=10_000)
    start = hub.token(0)

    def change(name: str, pad: int = 0) -> tuple[str, str, arranger_pb2.WatchJobsResponse]:
        msg = arranger_pb2.WatchJobsResponse(type="MODIFIED", name=name, id=name)
        msg.progress.message = "x" * pad
        return name, name, msg

    hub.publish([change("a"), change("b"), change("c")])
    assert [c.name for c in hub.since(0)] == ["a", "b", "c"]
    assert hub.position(start) is not None
    hub.publish([change("d")])  # a is forgotten: a token from before it is stale
    assert hub.position(start) is None and hub.position(hub.token(1)) is not None
    assert [c.name for c in hub.since(1)] == ["b", "c", "d"]
    assert [c.msg.resume_token for c in hub.since(2)] == [hub.token(3), hub.token(4)]
    hub.publish([change("big", pad=9_950)])  # with it, over the bytes: only it is kept
    assert [c.name for c in hub.since(4)] == ["big"] and hub.position(hub.token(3)) is None
    assert hub.position(hub.token(6)) is None  # past the newest


async def test_a_watcher_too_far_behind_is_dropped_and_resumes_where_it_was(tmp_path: Path) -> None:
    async with bare_server(tmp_path) as server, AsyncClient(f"127.0.0.1:{server.port}") as client:
        events = client.watch()
        assert (await anext(events)).type == "SYNCED"
        burst = 3 * MAX_BACKLOG  # more than it may have waiting, in changes of 100 jobs each
        news = []
        for i in range(burst):
            msg = arranger_pb2.WatchJobsResponse(type="MODIFIED", name="ghost", id="ghost")
            msg.progress.message = f"change {i}"
            news.append(("ghost", "ghost", msg))
        for at in range(0, burst, 100):
            server.watch.publish(news[at : at + 100])
        got = []
        with pytest.raises(ArrangerError) as dropped:
            async for event in events:
                got.append(event)
        assert dropped.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert [e.progress.message for e in got] == [f"change {i}" for i in range(MAX_BACKLOG)]
        rest = []
        async for event in client.watch(resume_token=got[-1].resume_token):
            rest.append(event.progress.message)
            if len(rest) == burst - MAX_BACKLOG:
                break
        assert rest == [f"change {i}" for i in range(MAX_BACKLOG, burst)]
