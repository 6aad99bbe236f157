"""A damaged store fails loudly and fast; a backup taken from a live server restores.

A corrupt database makes arranger-server print one line naming the file and the problem and
exit non-zero (a real process, so systemd restarts or alerts); `arranger-server --backup FILE`
copies the store while the server writes, and a server started on the copy has every job.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

from arranger.client.sdk import AsyncClient
from arranger.server.app import ArrangerServer
from arranger.server.main import main as server_main
from tests.conftest import FAST, job_spec


def server_command(data_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "arranger.server.main",
        "--insecure",
        "--data-dir",
        str(data_dir),
        "--listen",
        "127.0.0.1:0",
        "--http-listen",
        "",
        *extra,
    ]


def test_a_corrupt_store_stops_the_server_with_one_line(tmp_path: Path) -> None:
    data = tmp_path / "server"
    subprocess.run(server_command(data, "--init"), check=True, capture_output=True)
    db = data / "arranger.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        (page,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'jobs'").fetchone()
        (size,) = conn.execute("PRAGMA page_size").fetchone()
    body = bytearray(db.read_bytes())
    start = (page - 1) * size
    for i in range(start, min(len(body), start + 3000), 7):  # the jobs table's first page
        body[i] = 0x5A
    db.write_bytes(bytes(body))
    started = time.monotonic()
    ran = subprocess.run(
        server_command(data), check=False, capture_output=True, text=True, timeout=30
    )
    took = time.monotonic() - started
    assert ran.returncode == 1, ran
    lines = [line for line in (ran.stdout + ran.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: cannot read store {db}: database disk image is malformed")
    assert took < 5, f"it took {took:.1f} s to give up"


async def test_a_backup_of_the_live_store_restores_every_job(tmp_path: Path) -> None:
    config = dataclasses.replace(FAST, listen="127.0.0.1:0", data_dir=tmp_path / "live")
    server = ArrangerServer(config)
    await server.start()
    copy = tmp_path / "backups" / "arranger-1.db"
    try:
        async with AsyncClient(f"127.0.0.1:{server.port}", timeout_s=10) as client:
            for i in range(20):
                await client.submit(job_spec(f"job-{i}", ["true"]))

            async def keep_submitting() -> None:
                for i in range(20, 60):
                    await client.submit(job_spec(f"job-{i}", ["true"]))

            writing = asyncio.create_task(keep_submitting())
            code = await asyncio.to_thread(
                server_main,
                ["--insecure", "--data-dir", str(config.data_dir), "--backup", str(copy)],
            )
            await writing
        assert code == 0
        assert stat.S_IMODE(copy.stat().st_mode) == 0o600
        again = ["--insecure", "--data-dir", str(tmp_path), "--backup", str(copy)]
        assert await asyncio.to_thread(server_main, again) == 1  # it never overwrites
    finally:
        await server.stop()
    restored = tmp_path / "restored"
    restored.mkdir(mode=0o700)
    shutil.copyfile(copy, restored / "arranger.db")
    again = ArrangerServer(dataclasses.replace(config, data_dir=restored, init=False))
    await again.start()
    try:
        names = {job.name for job in again.controller.jobs.values()}
        assert {f"job-{i}" for i in range(20)} <= names  # all before the backup, maybe more
    finally:
        await again.stop()
