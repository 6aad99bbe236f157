"""Events and history come a bounded page at a time, at a bounded rate per user.

However many events a call asks for, one page is sent (its cost is bounded); a client follows
the pages to read them all, and a client of the previous release, which knows no page token,
still gets the newest events. Pages count against the caller's limits.listsPerSecond, as
submits do against submitsPerSecond; one user's pace costs nobody else theirs.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.protobuf import message_factory

from arranger.client.channel import make_channel
from arranger.client.sdk import AsyncClient
from arranger.server.limits import UserLimits
from arranger.server.model import EventRecord
from arranger.server.store import batch_of
from arranger.v1 import arranger_pb2, arranger_pb2_grpc
from tests.server.test_tenancy import Lab, lab, refusal
from tests.test_wire_contract import released_pool

EVENTS = 2500


async def stored_events(it: Lab) -> list[str]:
    """stored_events writes EVENTS test events to the server's store; their messages."""
    assert it.cluster.server is not None
    events = [EventRecord(float(i), "Test", f"event {i}", "j-1", "flood") for i in range(EVENTS)]
    await it.cluster.server.store.write(batch_of([], [], [], events, {}))
    return [e.message for e in events]


async def test_a_call_gets_one_bounded_page_and_clients_follow_the_pages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with lab(tmp_path, capsys) as it:
        messages = await stored_events(it)

        # A client of v0.1.0 asks for 100000 events and knows no token: the newest page.
        pool = released_pool(tmp_path)
        old_request = message_factory.GetMessageClass(
            pool.FindMessageTypeByName("arranger.v1.ListEventsRequest")
        )
        old_reply = message_factory.GetMessageClass(
            pool.FindMessageTypeByName("arranger.v1.ListEventsResponse")
        )
        channel = make_channel(it.cluster.address, it.tokens["bob"], it.cluster.tls / "ca.pem")
        async with channel:
            list_events = channel.unary_unary(
                "/arranger.v1.Arranger/ListEvents",
                request_serializer=old_request.SerializeToString,
                response_deserializer=old_reply.FromString,
            )
            reply = await list_events(old_request(limit=100_000), timeout=10)
        assert [e.message for e in reply.events] == messages[-1000:]

        # Pages of this release: the newest first, each oldest first, until none is left.
        newest = await it.bob.events(limit=10)
        assert [e.message for e in newest] == messages[-10:]
        everything = await it.bob.events(limit=100_000)
        assert [e.message for e in everything if e.kind == "Test"] == messages
        assert len(everything) < EVENTS + 50  # the Submitted and token events, no repeats

        refused = await refusal(it.bob.events(limit=100_001))
        assert refused.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "limit: must be 1..100000" in refused.message


async def test_pages_of_events_and_history_are_rate_limited_per_user(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    limits = UserLimits(lists_per_s=0.001, list_burst=3)
    async with lab(tmp_path, capsys, limits=limits) as it:
        await stored_events(it)
        await it.bob.events(limit=1)  # one page each
        await it.bob.history()
        await it.bob.events(limit=1)
        for call in (it.bob.events(limit=1), it.bob.history()):
            refused = await refusal(call)
            assert refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED, refused
            assert refused.message.startswith(
                "limits.listsPerSecond: user 'bob' reads pages of events and history faster "
                "than 0.001 per second (bursts of 3)"
            )
        # Bob's pace is his own; admins are not limited.
        await it.alice.events(limit=1)
        await it.alice.history()
        async with AsyncClient(
            it.cluster.address, ca=it.cluster.tls / "ca.pem", token=it.tokens["root"]
        ) as root:
            for _ in range(5):
                assert len(await root.events(limit=EVENTS)) >= EVENTS


async def test_a_page_token_is_the_server_s_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with lab(tmp_path, capsys) as it:
        messages = await stored_events(it)
        channel = make_channel(it.cluster.address, it.tokens["bob"], it.cluster.tls / "ca.pem")
        async with channel:
            stub = arranger_pb2_grpc.ArrangerStub(channel)
            first = await stub.ListEvents(arranger_pb2.ListEventsRequest(limit=2000), timeout=10)
            assert [e.message for e in first.events] == messages[-1000:]
            after = arranger_pb2.ListEventsRequest(limit=600, page_token=first.next_page_token)
            second = await stub.ListEvents(after, timeout=10)
            assert [e.message for e in second.events] == messages[-1600:-1000]
            for token in ("abc", "0", "-1", "1e3", "\u0661"):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    request = arranger_pb2.ListEventsRequest(page_token=token)
                    await stub.ListEvents(request, timeout=10)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "pageToken: not a token ListEvents gave" in str(refused.value.details())
