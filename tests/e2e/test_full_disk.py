"""Disk before memory, on a real full filesystem: a change that cannot be stored is refused
with UNAVAILABLE naming the store's reason, memory stays as the store holds it, and nothing is
ordered to agents; once there is room again, the same requests succeed.

The server's store lives on a small tmpfs the test mounts (the agents keep theirs elsewhere);
the test fills it with a ballast file. Skips, saying why, where it cannot mount.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from arranger.agent.agent import Agent
from arranger.agent.config import AgentConfig
from arranger.client.sdk import ArrangerError, AsyncClient
from arranger.server.app import ArrangerServer
from tests.conftest import FAST, NODE, Gate, eventually, job_spec

BIG_ENV = {"PAYLOAD": "x" * 60_000}  # every write of the job's row is this big


@contextlib.contextmanager
def small_filesystem(where: Path, size: str = "8m") -> Iterator[Path]:
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def fill(directory: Path) -> Path:
    """fill writes a ballast file until the filesystem has no room left."""
    ballast = directory / "ballast"
    with open(ballast, "wb") as f:
        chunk = b"\0" * 65536
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    with contextlib.suppress(OSError), open(ballast, "ab") as f:  # the last partial block
        while True:
            f.write(b"\0")
            f.flush()
    return ballast


@contextlib.asynccontextmanager
async def cluster_on(store_dir: Path, agents_dir: Path) -> AsyncIterator[str]:
    config = dataclasses.replace(FAST, listen="127.0.0.1:0", data_dir=store_dir)
    server = ArrangerServer(config)
    await server.start()
    address = f"127.0.0.1:{server.port}"
    nodes = [
        Agent(
            AgentConfig(
                server=address,
                node_name=f"n{i}",
                address="127.0.0.1",
                data_dir=agents_dir / f"n{i}",
                path_prepend=(str(Path(sys.executable).parent),),
                heartbeat_interval_s=0.2,
                fence_timeout_s=FAST.fence_timeout_s,
                limits=False,
            ),
            NODE,
        )
        for i in range(2)
    ]
    for agent in nodes:
        agent.start()
    try:
        for agent in nodes:
            await eventually(agent.connected.is_set, what="the agents to join")
        yield address
    finally:
        for agent in nodes:
            await agent.stop()
        await server.stop()


async def test_a_full_disk_refuses_changes_and_memory_stays_as_stored(
    tmp_path: Path, gate: Gate
) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    with small_filesystem(tmp_path / "store") as store_dir:
        async with (
            cluster_on(store_dir / "server", tmp_path / "agents") as address,
            AsyncClient(address, timeout_s=10) as client,
        ):
            body = job_spec("held", gate.command(tmp_path), workers=2)
            body["spec"]["leader"]["template"]["env"] = BIG_ENV
            await client.submit(body)
            running = await client.wait("held", stages=["Running"], timeout_s=30)
            pids = [p.pid for p in [running.status.leader, *running.status.workers]]

            ballast = fill(store_dir)
            with pytest.raises(ArrangerError) as refused:
                await client.stop("held")
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE
            assert "database or disk is full" in refused.value.message
            after = await client.get("held")  # as the store holds it: still running
            assert after.status.stage == "Running" and not after.spec.terminating
            assert [p.pid for p in [after.status.leader, *after.status.workers]] == pids
            assert all(p.state == "Running" for p in [after.status.leader, *after.status.workers])

            other = job_spec("later", ["true"])
            other["spec"]["leader"]["template"]["env"] = BIG_ENV
            with pytest.raises(ArrangerError) as refused:
                await client.submit(other)
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE
            with pytest.raises(ArrangerError) as missing:
                await client.get("later")
            assert missing.value.code == grpc.StatusCode.NOT_FOUND

            ballast.unlink()  # room again: the same requests succeed
            await client.stop("held")
            gate.open()
            done = await client.wait("held", timeout_s=30)
            assert done.status.stage == "Succeeded"
            await client.submit(other)
            assert (await client.get("later")).metadata.name == "later"
