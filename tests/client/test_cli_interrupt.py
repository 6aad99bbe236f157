"""Ctrl-C ends any `arranger` command quietly: exit status 130 and no traceback, also while a
stream (watch, logs -f) is open against a real server."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from arranger.client.dev import DevCluster
from arranger.client.sdk import ArrangerError, AsyncClient
from tests.conftest import eventually, job_spec, script

pytestmark = pytest.mark.e2e  # a real server, agents and processes

EXIT_INTERRUPTED = 130


@pytest.fixture(autouse=True)
def sigint_not_ignored() -> Iterator[None]:
    """The CLI gets SIGINT as a process started from a terminal does, even where the test
    runner was started with SIGINT ignored (a shell starts background jobs that way): an
    ignored signal stays ignored across exec, a handled one is reset to its default."""
    before = signal.getsignal(signal.SIGINT)
    if before == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


async def interrupted(server: str, *args: str, first: bytes) -> tuple[int, bytes]:
    """interrupted runs `arranger ARGS`, waits for it to print a line holding `first`, sends
    it SIGINT, and returns its exit status and stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "arranger.client.cli",
        "--server",
        server,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        async with asyncio.timeout(30):
            seen = b""
            while first not in seen:
                line = await proc.stdout.readline()
                assert line, (seen, await proc.stderr.read(), await proc.wait())
                seen += line
        proc.send_signal(signal.SIGINT)
        err = await asyncio.wait_for(proc.stderr.read(), 30)
        await asyncio.wait_for(proc.stdout.read(), 30)
        return await asyncio.wait_for(proc.wait(), 30), err
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_ctrl_c_ends_watch_and_logs_follow_quietly(
    cluster: DevCluster, tmp_path: Path
) -> None:
    server = cluster.address
    leader = script(
        tmp_path, "talk", "import signal\nprint('learner up', flush=True)\nsignal.pause()\n"
    )
    async with AsyncClient(server) as client:
        await client.submit(job_spec("talker", leader=leader))

        async def printed() -> bool:
            try:
                return b"learner up" in b"".join([c async for c in client.logs("talker")])
            except ArrangerError:  # not placed yet
                return False

        await eventually(printed, what="the learner's first line")
    rc, err = await interrupted(server, "logs", "-f", "talker", first=b"learner up")
    assert rc == EXIT_INTERRUPTED and b"Traceback" not in err, err
    assert err.strip() == b""
    rc, err = await interrupted(server, "watch", first=b"talker")
    assert rc == EXIT_INTERRUPTED and b"Traceback" not in err, err
    assert err.strip() == b""
    rc, err = await interrupted(server, "watch", "talker", first=b"talker")
    assert rc == EXIT_INTERRUPTED and err.strip() == b"", err


async def test_ctrl_c_ends_submit_wait_and_says_the_job_runs_on(
    cluster: DevCluster, tmp_path: Path
) -> None:
    leader = script(tmp_path, "idle", "import signal\nsignal.pause()\n")
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job_spec("waiter", leader=leader)))
    rc, err = await interrupted(
        cluster.address, "submit", "--wait", str(job_file), first=b"submitted"
    )
    assert rc == EXIT_INTERRUPTED and b"Traceback" not in err, err
    assert err.startswith(b"job waiter runs on; `arranger stop ") and b"` stops it" in err, err
