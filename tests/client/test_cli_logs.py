"""`arranger logs --tail N` prints the last N lines whole, however long they are: the CLI as a
real process against a real cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from arranger.client.dev import DevCluster
from arranger.client.sdk import ArrangerError, AsyncClient
from tests.client.test_cli import arranger
from tests.conftest import eventually, job_spec, script

pytestmark = pytest.mark.e2e  # a real server, agents and processes

# Lines of every length up to 1.1 MiB (a chunk the server reads is 1 MiB), then "done".
LEARNER = """
import signal, sys
for i in range(30):
    sys.stdout.write(f"line {i} " + "x" * (i * 40000) + "\\n")
print("done", flush=True)
signal.pause()
"""


async def test_tail_counts_lines_and_never_cuts_one(cluster: DevCluster, tmp_path: Path) -> None:
    server = cluster.address
    async with AsyncClient(server) as client:
        await client.submit(job_spec("chatty", leader=script(tmp_path, "chatty", LEARNER)))

        async def finished_writing() -> bool:
            try:
                async for chunk in client.logs("chatty", tail_bytes=5):
                    return chunk.endswith(b"done\n")
            except ArrangerError:  # not placed yet
                return False
            return False

        await eventually(finished_writing, what="the learner's last line")
    rc, out, err = await arranger("logs", "chatty", "--tail", "3", server=server)
    assert rc == 0, err
    lines = out.splitlines()
    assert [line[:8] for line in lines] == ["line 28 ", "line 29 ", "done"]
    assert len(lines[0]) == len("line 28 ") + 28 * 40000
    rc, out, _ = await arranger("logs", "chatty", "--tail", "1", server=server)
    assert out == "done\n"
    rc, out, _ = await arranger("logs", "chatty", "--tail", "100", server=server)
    assert out.startswith("line 0 \nline 1 x") and out.count("\n") == 31
    rc, _, err = await arranger("logs", "chatty", "--tail", "-1", server=server)
    assert rc == 2 and "argument --tail: expected 0 or more lines, got -1" in err
