"""An operator's mistake with the store does not pass for a new cluster or a second one.

An empty store file (a `touch`, a copy onto a full disk) is refused without `--init`, with one
line naming the file; a second server on a SQLite store that a server holds is refused with
one line naming the holder, while commands beside the server (`--backup`, `arranger token`)
still work (tests/server/test_store_damage.py, tests/server/test_auth.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
from pathlib import Path

import pytest

from arranger.client.sdk import AsyncClient
from arranger.server.app import ArrangerServer
from arranger.server.store import StoreError
from tests.conftest import FAST, bare_server, job_spec
from tests.server.test_store_damage import server_command


def refused(command: list[str]) -> str:
    """refused: the one line a server command that must fail prints."""
    ran = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 1, ran
    lines = [line for line in (ran.stdout + ran.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_an_empty_store_file_is_refused_not_made_a_new_cluster(tmp_path: Path) -> None:
    data = tmp_path / "server"
    data.mkdir(mode=0o700)
    db = data / "arranger.db"
    db.touch(mode=0o600)
    assert refused(server_command(data)) == (
        f"error: store {db} is empty (no schema, no cluster): restore it from a backup "
        '(README, "Backups"), or start arranger-server with --init to make a new cluster'
    )
    assert db.stat().st_size == 0  # nothing was written to it
    made = subprocess.run(
        server_command(data, "--init"), check=False, capture_output=True, text=True
    )
    assert made.returncode == 0 and "created a store" in made.stdout, made


async def test_a_second_server_on_a_sqlite_store_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "server"
    async with bare_server(data) as first:
        line = await asyncio.to_thread(refused, server_command(data))
        assert line == (
            f"error: another arranger-server (pid {os.getpid()}) serves the store "
            f"{data / 'arranger.db'}: one server per SQLite store (stop that one first; a "
            "standby server needs PostgreSQL)"
        )
        config = dataclasses.replace(FAST, listen="127.0.0.1:0", data_dir=data)
        with pytest.raises(StoreError, match="another arranger-server"):
            await ArrangerServer(config).start()  # in one process too
        async with AsyncClient(f"127.0.0.1:{first.port}", timeout_s=10) as client:
            await client.submit(job_spec("still", ["true"]))  # the first serves on, and stores
            assert [j.name for j in await client.jobs()] == ["still"]
    again = ArrangerServer(dataclasses.replace(FAST, listen="127.0.0.1:0", data_dir=data))
    await again.start()  # the first has stopped: the store is free
    await again.stop()
