"""inert, and the tables no real route fills with such text today (names the server checks):
what the server sends is printed written out, control characters and rich markup alike, on
a terminal as into a pipe. See test_cli_hostile for the commands against a real server."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

import pytest
from rich.console import Console

from arranger.client import cli, history, render, top
from arranger.client.inert import inert, inert_markup
from arranger.v1 import arranger_pb2, job_pb2

HOSTILE = "\x1b]0;owned\x07\x1b[2J\x9b2J\x7f\x00 [link=http://x]click[/link] [bold]b[/bold]"
SHOWN = "\\x1b]0;owned\\x07\\x1b[2J\\x9b2J\\x7f\\x00 [link=http://x]click[/link] [bold]b[/bold]"
COLOURS = re.compile(r"\x1b\[[0-9;]*m")  # rich's own, on a terminal
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # any control but the newline


def test_inert_writes_out_every_control_character() -> None:
    assert inert(HOSTILE) == SHOWN
    assert inert("tab\there\r\nnext\x85") == "tab\\there\\r\\nnext\\x85"
    assert inert("C:\\path ünïcode ✓") == "C:\\path ünïcode ✓"  # printable: left as it is
    assert inert(inert(HOSTILE)) == inert(HOSTILE)


def test_inert_markup_shows_as_written() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=400)
    console.print(inert_markup(HOSTILE))
    assert COLOURS.sub("", console.file.getvalue()) == SHOWN + "\n"  # type: ignore[attr-defined]


def printed(*renderables: object) -> str:
    """printed: what a terminal of 2000 columns is sent for `renderables`, rich's colours out."""
    console = Console(file=io.StringIO(), force_terminal=True, width=2000, emoji=False)
    for renderable in renderables:
        console.print(renderable)
    return COLOURS.sub("", console.file.getvalue())  # type: ignore[attr-defined]


def test_tables_show_what_the_server_sent_inert() -> None:
    pod = job_pb2.PodStatus(name=HOSTILE, node=HOSTILE, state=HOSTILE, role=HOSTILE)
    job = job_pb2.TYJob()
    job.metadata.name = HOSTILE
    job.status.stage = HOSTILE
    job.status.leader.CopyFrom(pod)
    summary = job_pb2.JobSummary(name=HOSTILE, owner=HOSTILE)
    summary.progress.stage = HOSTILE
    record = arranger_pb2.HistoryRecord(
        name=HOSTILE,
        id=HOSTILE,
        owner=HOSTILE,
        queue=HOSTILE,
        stage=HOSTILE,
        reason=HOSTILE,
        nodes=[HOSTILE],
    )
    queue = arranger_pb2.Queue(name=HOSTILE, users=[HOSTILE], machine_groups=[HOSTILE])
    token = SimpleNamespace(name=HOSTILE, user=HOSTILE, role=HOSTILE, created=0, last_used=None)
    for renderable, times in (
        (top.jobs_frame([summary]), 3),
        (top.job_frame(job), 5),
        (render.pods_table([pod]), 4),
        (history.history_table([record]), 7),
        (render.queues_table([queue]), 3),
        (render.tokens_table([token]), 3),
    ):
        text = printed(renderable)
        assert not CONTROL.search(text), text
        assert text.count(SHOWN) == times, text


def test_an_error_is_reported_inert(capsys: pytest.CaptureFixture[str]) -> None:
    cli.report(f"job {HOSTILE!s} not found\nsecond line")
    err = capsys.readouterr().err
    assert err == f"error: job {SHOWN} not found\nerror: second line\n"
