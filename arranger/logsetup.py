"""logsetup configures structlog for the server, the agent and `arranger dev`.

Every line carries its time in UTC, ISO 8601 with milliseconds (`2026-11-27T00:13:00.123Z`),
the level and the event; `text` (the default) renders key=value lines, `json` one JSON object
a line (for a log shipper). Below debug, an exception is one field on the line that logs it
(`exc="StoreError: ..."`), not a traceback, and asyncio's complaints about tasks and
generators torn down with the event loop (gRPC streams ending as a daemon stops or a
connection drops) are not logged; at debug both are, whole.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any

import structlog
import structlog.tracebacks

FORMATS = ("text", "json")


def configure(level: str = "info", fmt: str = "text") -> None:
    """configure: lines on stderr at `level` and above, rendered as `fmt` (FORMATS)."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    debug = numeric <= logging.DEBUG
    processors: list[Any] = [structlog.processors.add_log_level, _utc_time]
    if not debug:
        processors.append(_one_line_exception)
    if fmt == "json":
        tracebacks = structlog.tracebacks.ExceptionDictTransformer(show_locals=False)  # no secrets
        processors += [
            structlog.processors.ExceptionRenderer(tracebacks),
            structlog.processors.JSONRenderer(),
        ]
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()))
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    # asyncio logs, at ERROR, each task or async generator still pending when a gRPC stream
    # is torn down: noise unless one is looking for it.
    logging.getLogger("asyncio").setLevel(logging.DEBUG if debug else logging.CRITICAL)


def _utc_time(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    stamp = datetime.now(UTC).isoformat(timespec="milliseconds")
    event["timestamp"] = stamp.replace("+00:00", "Z")
    return event


def _one_line_exception(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    """_one_line_exception: the exception being logged as `Type: message` (its first line),
    in `exc`, without a traceback."""
    info = event.pop("exc_info", None)
    if info is True:
        info = sys.exc_info()
    elif isinstance(info, BaseException):
        info = (type(info), info, info.__traceback__)
    if info and info[1] is not None:
        event["exc"] = f"{info[0].__name__}: {info[1]}".splitlines()[0]
    return event
