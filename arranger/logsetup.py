"""logsetup configures structlog for the server, the agent and `arranger dev`.

Every line carries its time in UTC, ISO 8601 with milliseconds (`2026-11-27T00:13:00.123Z`),
the level and the event; `text` (the default) renders key=value lines, `json` one JSON object
a line (for a log shipper). Below debug, an exception is one field on the line that logs it
(`exc="StoreError: ..."`), not a traceback, and asyncio's complaints about tasks and
generators torn down with the event loop (gRPC streams ending as a daemon stops or a
connection drops) are not logged; at debug both are, whole. The standard library's loggers
(gRPC's, asyncio's) write the same lines, with the logger's name.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any

import structlog
import structlog.tracebacks

FORMATS = ("text", "json")
_HANDLER = "arranger.logsetup"  # the root logger's handler configure adds


def configure(level: str = "info", fmt: str = "text") -> None:
    """configure: lines on stderr at `level` and above, rendered as `fmt` (FORMATS), both
    structlog's and the standard library's (gRPC's, asyncio's), which pass the same
    processors."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    debug = numeric <= logging.DEBUG
    stamped: list[Any] = [structlog.processors.add_log_level, _utc_time]
    if not debug:
        stamped.append(_one_line_exception)
    rendered: list[Any]
    if fmt == "json":
        tracebacks = structlog.tracebacks.ExceptionDictTransformer(show_locals=False)  # no secrets
        rendered = [
            structlog.processors.ExceptionRenderer(tracebacks),
            structlog.processors.JSONRenderer(),
        ]
    else:
        rendered = [structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())]
    structlog.configure(
        processors=[*stamped, *rendered],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    _route_standard_library(numeric, [structlog.stdlib.add_logger_name, *stamped], rendered)
    # asyncio logs, at ERROR, each task or async generator still pending when a gRPC stream
    # is torn down: noise unless one is looking for it.
    logging.getLogger("asyncio").setLevel(logging.DEBUG if debug else logging.CRITICAL)


def _route_standard_library(level: int, stamped: list[Any], rendered: list[Any]) -> None:
    """_route_standard_library sends the root logger's records at `level` and above to stderr
    through `stamped` and `rendered`, in place of Python's last-resort handler (no time, a
    traceback over many lines). Called again, it replaces the handler it added, and leaves
    others (pytest's caplog) in place."""
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=stamped,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *rendered],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


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
