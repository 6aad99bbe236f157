"""The daemons' log lines: UTC ISO times with milliseconds, text or JSON, an exception on one
line below debug, and no asyncio teardown noise. Each case in a process of its own (the
configuration is process-wide)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")

PROGRAM = """
import logging, sys
import structlog
from arranger import logsetup
logsetup.configure(sys.argv[1], sys.argv[2])
log = structlog.get_logger("arranger.test")
log.info("hello", node="n1")
try:
    raise ValueError("boom\\nsecond line")
except ValueError:
    log.exception("it failed", node="n1")
logging.getLogger("asyncio").error("Task was destroyed but it is pending!")
"""


# gRPC's servicer failure, as grpc._server logs it: through the standard library.
LIBRARY = """
import logging, sys
from arranger import logsetup
logsetup.configure(sys.argv[1], sys.argv[2])
try:
    raise RuntimeError("servicer broke\\nsecond line")
except RuntimeError as exc:
    logging.getLogger("grpc._server").error("Unexpected error raised by %s", "GetJob", exc_info=exc)
logging.getLogger("grpc._server").debug("below info")
"""


def lines(level: str, fmt: str, program: str = PROGRAM) -> list[str]:
    ran = subprocess.run(
        [sys.executable, "-c", program, level, fmt], check=True, capture_output=True, text=True
    )
    return ran.stderr.splitlines()


def test_json_lines_carry_utc_milliseconds_and_one_line_exceptions() -> None:
    hello, failed = (json.loads(line) for line in lines("info", "json"))
    assert STAMP.fullmatch(hello["timestamp"]), hello
    assert (hello["level"], hello["event"], hello["node"]) == ("info", "hello", "n1")
    assert STAMP.fullmatch(failed["timestamp"])
    assert (failed["level"], failed["event"]) == ("error", "it failed")
    assert failed["exc"] == "ValueError: boom"


def test_text_lines_start_with_the_time_and_keep_an_exception_on_its_line() -> None:
    hello, failed = lines("info", "text")
    assert STAMP.fullmatch(hello.split()[0]) and "hello" in hello and "node=n1" in hello
    assert "it failed" in failed and "exc='ValueError: boom'" in failed


def test_debug_keeps_tracebacks_and_asyncio_complaints() -> None:
    out = "\n".join(lines("debug", "text"))
    assert "Traceback (most recent call last)" in out and "second line" in out
    assert "Task was destroyed" in out
    failed = json.loads(lines("debug", "json")[1])
    (raised,) = failed["exception"]
    assert raised["exc_type"] == "ValueError" and raised["exc_value"] == "boom\nsecond line"
    assert raised["frames"] and not any("locals" in frame for frame in raised["frames"])


def test_library_lines_are_the_daemons_lines() -> None:
    (failed,) = (json.loads(line) for line in lines("info", "json", LIBRARY))
    assert STAMP.fullmatch(failed["timestamp"]), failed
    assert (failed["level"], failed["logger"]) == ("error", "grpc._server")
    assert failed["event"] == "Unexpected error raised by GetJob"
    assert failed["exc"] == "RuntimeError: servicer broke"
    (failed_text,) = lines("info", "text", LIBRARY)
    assert STAMP.fullmatch(failed_text.split()[0]), failed_text
    assert "grpc._server" in failed_text and "exc='RuntimeError: servicer broke'" in failed_text


def test_debug_keeps_library_tracebacks() -> None:
    out = lines("debug", "text", LIBRARY)
    assert STAMP.fullmatch(out[0].split()[0]) and "below info" in out[-1]
    assert "Traceback (most recent call last)" in "\n".join(out) and "second line" in out
    failed = json.loads(lines("debug", "json", LIBRARY)[0])
    (raised,) = failed["exception"]
    assert (
        raised["exc_type"] == "RuntimeError"
        and raised["exc_value"] == "servicer broke\nsecond line"
    )
