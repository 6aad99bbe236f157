"""metering: every gRPC call the server answers, counted by method and status code, and the
time each unary call took, for the metrics (`arranger_grpc_requests_total`,
`arranger_grpc_request_duration_seconds`).

The interceptor runs first, outside the Gatekeeper, so refusals are counted too. Methods are
the ones the server serves (an unknown method has no handler and is not counted), so the
labels are bounded. A call that streams its replies is counted when it ends and not timed
(a watch lasts as long as its client).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from arranger.security import HANDLER_KINDS

Record = Callable[[str, str, float | None], None]  # method, code, seconds (None: a stream)
Handler = Any  # a grpc.RpcMethodHandler of any request and reply (as in security)


class Meter(grpc.aio.ServerInterceptor):
    """Meter calls `record(method, code, seconds)` as each call ends."""

    def __init__(self, record: Record) -> None:
        self.record = record

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(details)
        if handler is None:
            return handler
        return _metered(handler, str(details.method).lstrip("/"), self.record)


def _code(context: Any, failed: bool) -> str:
    """_code: the status the call ended with (what the handler set or aborted with)."""
    code = context.code()
    if code is None:
        return "UNKNOWN" if failed else "OK"
    if isinstance(code, grpc.StatusCode):
        return code.name
    return next((s.name for s in grpc.StatusCode if s.value[0] == int(code)), "UNKNOWN")


def _metered(handler: Handler, method: str, record: Record) -> Handler:
    kind, make, streams = next(k for k in HANDLER_KINDS if getattr(handler, k[0]) is not None)
    inner = getattr(handler, kind)

    async def reply(request: Any, context: Any) -> Any:
        started, failed = time.perf_counter(), True
        try:
            result = await inner(request, context)
            failed = False
            return result
        finally:
            record(method, _code(context, failed), time.perf_counter() - started)

    async def replies(request: Any, context: Any) -> Any:
        failed = True
        try:
            async for item in inner(request, context):
                yield item
            failed = False
        finally:
            record(method, _code(context, failed), None)

    behaviour = replies if streams else reply
    return make(behaviour, handler.request_deserializer, handler.response_serializer)
