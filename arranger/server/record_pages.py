"""record_pages: pages of what only the store keeps, read by ListEvents and ListHistory.

Events (ListEvents) are paged newest page first. A page holds the newest events older than its
token (the first: the newest of all), oldest first, at most MAX_EVENT_PAGE whatever `limit`
asks: a call costs what one page costs. `limit` keeps the range v0.1.0 took (1..100000), so
that its clients, which know no page token, still get the newest events (a page of them)
instead of a refusal. The token is the seq of the oldest event sent; the store reads a page
from an index, however many events it keeps.

History records (ListHistory) are the accounting records of finished jobs. Every user sees
every record: none holds a secret. Filters are bounded in size; pages are keyed by (end time,
job id), oldest end first. A page holds at most MAX_SENT records whatever its size asks (up to
MAX_PAGE is taken, as clients of v0.1.0 may ask it; they follow the token), so that a call costs
what one page costs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import grpc

from arranger.server.convert import event_to_proto, history_to_proto
from arranger.server.exec_relay import visible_events
from arranger.server.listing import Key, key_token, parse_key
from arranger.server.store import HistoryQuery, Store, StoreError
from arranger.v1 import arranger_pb2

Context = grpc.aio.ServicerContext[Any, Any]

DEFAULT_LIMIT = 1000
MAX_LIMIT = 100_000  # what a request may ask (v0.1.0's range)
MAX_EVENT_PAGE = 1000  # what one page of events holds, at most

DEFAULT_PAGE = 500
MAX_PAGE = 5000
MAX_SENT = 1000
MAX_FILTER_CHARS = 256  # a user, queue or name to filter on


def page_size(request: arranger_pb2.ListEventsRequest) -> int | None:
    """page_size: how many events the request's page holds (None: its limit is out of range)."""
    limit = request.limit or DEFAULT_LIMIT
    return min(limit, MAX_EVENT_PAGE) if 0 < limit <= MAX_LIMIT else None


def parse_token(text: str) -> int | None:
    """parse_token: the seq a next_page_token names (None: not one ListEvents gave)."""
    return int(text) if text.isascii() and text.isdigit() and 0 < int(text) < 2**63 else None


async def list_events(
    store: Store,
    job_id: str,
    request: arranger_pb2.ListEventsRequest,
    context: Context,
    private: Callable[[str], bool],
) -> arranger_pb2.ListEventsResponse:
    """list_events: a page of the events the request asks for (of job `job_id`, or all), as
    the caller may read them (`private(job_id)`: whether it may read that job's private
    values; see exec_relay.visible_events)."""
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
    shown = visible_events(page, private)
    reply = arranger_pb2.ListEventsResponse(events=[event_to_proto(e) for e in shown])
    if more:
        reply.next_page_token = str(page[0].seq)
    return reply


async def list_history(
    store: Store, request: arranger_pb2.ListHistoryRequest, context: Context
) -> arranger_pb2.ListHistoryResponse:
    """list_history answers ListHistory: a page of the history records the request asks for."""
    size = request.page_size or DEFAULT_PAGE
    if not 0 < size <= MAX_PAGE:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"pageSize: must be 1..{MAX_PAGE}")
    size = min(size, MAX_SENT)
    filters = (
        ("user", request.user),
        ("queue", request.queue),
        ("name", request.name),
        ("experiment", request.experiment),
    )
    for field, value in filters:
        if len(value) > MAX_FILTER_CHARS:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{field}: at most {MAX_FILTER_CHARS} characters",
            )
    since = request.since.ToNanoseconds() / 1e9 if request.HasField("since") else -math.inf
    until = request.until.ToNanoseconds() / 1e9 if request.HasField("until") else math.inf
    after: Key = (since, "")
    if request.page_token:
        token = parse_key(request.page_token)
        if token is None:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "pageToken: not a token ListHistory gave; start again without one",
            )
            raise AssertionError
        after = max(after, token)
    query = HistoryQuery(
        after, until, request.user, request.queue, request.name, size + 1, request.experiment
    )
    try:
        records = await store.history(query)
    except StoreError as exc:
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot read the history: {exc}")
        raise
    reply = arranger_pb2.ListHistoryResponse(records=[history_to_proto(r) for r in records[:size]])
    if len(records) > size:
        last = records[size - 1]
        reply.next_page_token = key_token((last.end_time, last.job_id))
    return reply
