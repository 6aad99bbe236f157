"""What one user's job says reaches another user's terminal as text only. A job fails with
terminal escapes and rich markup in its pods' reason (an agent's word: a container runtime
echoes what it was given), so in its message, its events and its history, on a node whose GPU
model says the same; `arranger get`, `events`, `explain`, `list`, `watch`, `history`, `top` and
`nodes` read it, as real processes against a real server, into a pipe and onto a terminal (a
pty). Nothing is printed that a terminal acts on but rich's own colours: no escape sequence,
bell, DEL or C1 control; the escapes show written out (`\\x1b`) and the markup as written."""

from __future__ import annotations

import asyncio
import os
import pty
import re
import select
import subprocess
import sys
import time
import tty
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from arranger.client.sdk import AsyncClient
from arranger.v1 import agent_pb2, node_pb2
from tests.conftest import bare_server, job_spec
from tests.played_agent import launches, played_agent, registration

TITLE = "\x1b]0;owned\x07"  # sets the window's title
CLEAR = "\x1b[2J"  # clears the screen
LINK = "\x1b]8;;http://evil.example/\x1b\\here\x1b]8;;\x1b\\"  # an OSC 8 link (CVE-2021-25743)
C1 = "\x9b31m\x7f"  # CSI as one C1 character, then DEL
MARKUP = "[link=http://x]click[/link] [red]red[/red] :thumbs_up:"
HOSTILE = f"{TITLE} {CLEAR} {LINK} {C1} {MARKUP}"
SHOWN = ("\\x1b]0;owned\\x07", "\\x1b[2J", "\\x9b31m\\x7f", *MARKUP.split())
COLOURS = re.compile(r"\x1b\[[0-9;]*m")  # rich's own SGR, on a terminal only
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # any control but the newline
COMMANDS = (
    ("get", "mark"),
    ("events", "mark"),
    ("explain", "mark"),
    ("list", "--all"),
    ("watch", "mark"),
    ("history",),
    ("history", "-o", "csv"),
    ("top", "mark", "--once"),
    ("nodes",),
)


def arranger(server: str, args: tuple[str, ...], terminal: bool) -> str:
    """arranger: what `arranger ARGS` wrote (stdout and stderr), into pipes or onto a pty of
    200 columns."""
    argv = [sys.executable, "-m", "arranger.client.cli", "--server", server, *args]
    env = {**os.environ, "COLUMNS": "200", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    if not terminal:
        done = subprocess.run(argv, capture_output=True, env=env, timeout=60, check=False)
        return (done.stdout + done.stderr).decode()
    main, side = pty.openpty()
    tty.setraw(side)  # the bytes as written, without the terminal's "\n" to "\r\n"
    os.set_blocking(main, False)
    proc = subprocess.Popen(argv, stdin=side, stdout=side, stderr=side, env=env)
    os.close(side)
    out, deadline = b"", time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], deadline - time.monotonic())
            try:
                chunk = os.read(main, 65536) if ready else b""
            except OSError:  # EIO: every writer to the terminal has gone
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(main)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return out.decode()


def failed(launch: agent_pb2.LaunchPod) -> agent_pb2.AgentMessage:
    """failed: the agent's word that the launched attempt failed, HOSTILE in its reason (as a
    container runtime's message might echo what it was given)."""
    report = agent_pb2.PodReport(
        pod_uid=launch.pod_uid,
        attempt=launch.attempt,
        state="Failed",
        exit_code=127,
        reason=f"ContainerCannotRun: cannot start `x`: {HOSTILE}",
        finish_time=time.time(),
    )
    return agent_pb2.AgentMessage(pod_reports=agent_pb2.PodReports(reports=[report]))


@pytest.fixture
async def marked(tmp_path: Path) -> AsyncIterator[str]:
    """marked: a real server's address, where job `mark` failed with HOSTILE in its pods'
    reasons, its message, its events and its history, on node n0 whose GPU's model is
    HOSTILE (both from an agent the test plays)."""
    gpu = node_pb2.Gpu(index=0, uuid="GPU-0", model=HOSTILE, memory=2**34, fake=True)
    async with bare_server(tmp_path / "server") as server:
        address = f"127.0.0.1:{server.port}"
        async with (
            played_agent(address, registration("n0", gpus=[gpu])) as stream,
            AsyncClient(address) as client,
        ):
            await client.submit(job_spec("mark", leader=["true"], restartLimit=0))
            (leader,) = await launches(stream, 1)  # workers wait for the leader's address
            await stream.write(failed(leader))
            await client.wait("mark", timeout_s=30)
            yield address


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "terminal"])
async def test_another_users_text_is_shown_inert(marked: str, terminal: bool) -> None:
    shown: dict[tuple[str, ...], str] = {}
    for args in COMMANDS:
        printed = await asyncio.to_thread(arranger, marked, args, terminal)
        text = printed.replace("\r\n", "\n")  # a CSV's line ends
        text = COLOURS.sub("", text) if terminal else text
        assert not CONTROL.search(text), (args, printed)
        shown[args] = text
    for args in (
        ("get", "mark"),
        ("events", "mark"),
        ("explain", "mark"),
        ("watch", "mark"),
        ("history", "-o", "csv"),
        ("nodes",),
    ):
        assert all(part in shown[args] for part in SHOWN), (args, shown[args])
