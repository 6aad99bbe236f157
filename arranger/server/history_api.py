"""history_api answers ListHistory: pages of the accounting records of finished jobs.

Every user sees every record: none holds a secret. Filters are bounded in size; pages are
keyed by (end time, job id), oldest end first. A page holds at most MAX_SENT records whatever
its size asks (up to MAX_PAGE is taken, as clients of v0.1.0 may ask it; they follow the
token), so that a call costs what one page costs.
"""

from __future__ import annotations

import math
from typing import Any

import grpc

from arranger.server.convert import history_to_proto
from arranger.server.listing import Key, key_token, parse_key
from arranger.server.store import HistoryQuery, Store, StoreError
from arranger.v1 import arranger_pb2

Context = grpc.aio.ServicerContext[Any, Any]

DEFAULT_PAGE = 500
MAX_PAGE = 5000
MAX_SENT = 1000
MAX_FILTER_CHARS = 256  # a user, queue or name to filter on


async def list_history(
    store: Store, request: arranger_pb2.ListHistoryRequest, context: Context
) -> arranger_pb2.ListHistoryResponse:
    """list_history answers ListHistory: a page of the history records the request asks for."""
    size = request.page_size or DEFAULT_PAGE
    if not 0 < size <= MAX_PAGE:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"pageSize: must be 1..{MAX_PAGE}")
    size = min(size, MAX_SENT)
    for field, value in (("user", request.user), ("queue", request.queue), ("name", request.name)):
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
    query = HistoryQuery(after, until, request.user, request.queue, request.name, size + 1)
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
