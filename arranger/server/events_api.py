"""events_api answers ListEvents: pages of the events the store keeps, the newest page first.

A page holds the newest events older than its token (the first: the newest of all), oldest
first, at most MAX_PAGE whatever `limit` asks: a call costs what one page costs. `limit` keeps
the range v0.1.0 took (1..100000), so that its clients, which know no page token, still get
the newest events (a page of them) instead of a refusal. The token is the seq of the oldest
event sent; the store reads a page from an index, however many events it keeps.
"""

from __future__ import annotations

from typing import Any

import grpc

from arranger.server.convert import event_to_proto
from arranger.server.store import Store, StoreError
from arranger.v1 import arranger_pb2

Context = grpc.aio.ServicerContext[Any, Any]

DEFAULT_LIMIT = 1000
MAX_LIMIT = 100_000  # what a request may ask (v0.1.0's range)
MAX_PAGE = 1000  # what one page holds, at most


def page_size(request: arranger_pb2.ListEventsRequest) -> int | None:
    """page_size: how many events the request's page holds (None: its limit is out of range)."""
    limit = request.limit or DEFAULT_LIMIT
    return min(limit, MAX_PAGE) if 0 < limit <= MAX_LIMIT else None


def parse_token(text: str) -> int | None:
    """parse_token: the seq a next_page_token names (None: not one ListEvents gave)."""
    return int(text) if text.isascii() and text.isdigit() and 0 < int(text) < 2**63 else None


async def list_events(
    store: Store, job_id: str, request: arranger_pb2.ListEventsRequest, context: Context
) -> arranger_pb2.ListEventsResponse:
    """list_events: a page of the events the request asks for (of job `job_id`, or all)."""
    size = page_size(request)
    if size is None:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"limit: must be 1..{MAX_LIMIT}")
        raise AssertionError
    before = 0
    if request.page_token:
        token = parse_token(request.page_token)
        if token is None:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "pageToken: not a token ListEvents gave; start again without one",
            )
            raise AssertionError
        before = token
    try:
        events = await store.events(job_id, size + 1, before)
    except StoreError as exc:
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot read the events: {exc}")
        raise
    more = len(events) > size
    page = events[1:] if more else events  # oldest first: the extra one is the oldest
    reply = arranger_pb2.ListEventsResponse(events=[event_to_proto(e) for e in page])
    if more:
        reply.next_page_token = str(page[0].seq)
    return reply
