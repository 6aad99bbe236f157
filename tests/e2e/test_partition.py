"""A real network partition: an agent in its own network namespace, joined to the server by a
veth pair, loses its link. It stops its pods after fenceTimeout; the server declares the node
lost after nodeTimeout and starts the leader again on the other node, and the old leader is
gone before the new one starts: never two live leaders.

Needs root (network namespaces); skipped with the reason where the machine does not allow it.
Traffic stays on the veth pair the test made and on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import yaml

from arranger.agent.agent import Agent
from arranger.agent.config import AgentConfig
from arranger.client.sdk import AsyncClient
from arranger.server.app import ArrangerServer
from tests.conftest import FAST, NODE, eventually, job_spec, script

HOST_IP, NS_IP = "10.231.77.1", "10.231.77.2"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@contextlib.contextmanager
def namespace() -> Iterator[tuple[str, str]]:
    """namespace: a network namespace linked to this one by a veth pair (HOST_IP here,
    NS_IP there); yields (namespace, host end of the link). Removed afterwards."""
    tag = f"{os.getpid() % 100000}"
    ns, host, inner = f"arranger-test-{tag}", f"arh{tag}", f"arn{tag}"
    try:
        ip("netns", "add", ns)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        pytest.skip(f"network namespaces unavailable here: {detail.decode().strip() or exc}")
    try:
        try:
            ip("link", "add", host, "type", "veth", "peer", "name", inner)
            ip("link", "set", inner, "netns", ns)
            ip("addr", "add", f"{HOST_IP}/30", "dev", host)
            ip("link", "set", host, "up")
            ip("netns", "exec", ns, "ip", "addr", "add", f"{NS_IP}/30", "dev", inner)
            ip("netns", "exec", ns, "ip", "link", "set", inner, "up")
            ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"cannot link a network namespace here: {exc.stderr.decode().strip()}")
        yield ns, host
    finally:
        pids = subprocess.run(
            ["ip", "netns", "pids", ns], check=False, capture_output=True, text=True
        )
        for pid in pids.stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        with contextlib.suppress(subprocess.CalledProcessError):
            ip("link", "del", host)
        ip("netns", "del", ns)


def agent_in(ns: str, server: str, directory: Path) -> subprocess.Popen[bytes]:
    """agent_in starts arranger-agent "far" inside the namespace."""
    settings = {
        "server": server,
        "nodeName": "far",
        "address": NS_IP,
        "dataDir": str(directory / "far"),
        "runAsRoot": True,
    }
    (directory / "far.yaml").write_text(yaml.safe_dump(settings))
    with (directory / "far.log").open("ab") as log:
        return subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                ns,
                sys.executable,
                "-m",
                "arranger.agent.main",
                "--config",
                str(directory / "far.yaml"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )


@contextlib.asynccontextmanager
async def split_cluster(directory: Path) -> AsyncIterator[tuple[str, AsyncClient, Agent]]:
    """split_cluster: a server on the link's host end, an agent "far" inside the namespace
    (a real process) and an agent "near" in this process (started when the caller is ready:
    yielded unstarted). Yields (host end of the link, client, near agent)."""
    with namespace() as (ns, host):
        config = dataclasses.replace(FAST, listen=f"{HOST_IP}:0", data_dir=directory / "server")
        server = ArrangerServer(config)
        await server.start()
        address = f"{HOST_IP}:{server.port}"
        far = agent_in(ns, address, directory)
        near_config = AgentConfig(
            server=address,
            node_name="near",
            address=HOST_IP,
            data_dir=directory / "near",
            path_prepend=(str(Path(sys.executable).parent),),
            heartbeat_interval_s=0.2,
            fence_timeout_s=FAST.fence_timeout_s,
            reconnect_max_s=0.3,
            stop_pods_on_exit=True,
        )
        near = Agent(near_config, NODE)
        try:
            async with AsyncClient(address, timeout_s=10) as client:
                yield host, client, near
        finally:
            await near.stop()
            far.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                far.wait(timeout=20)
            far.kill()
            far.wait()
            await server.stop()


@pytest.mark.timeout(120)
async def test_a_partitioned_leader_is_stopped_before_its_replacement_starts(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "journal"
    # The leader notes when it starts and when it is told to stop (the fence sends SIGTERM).
    leader = script(
        tmp_path,
        "leader",
        f"""
import os, signal, sys, time
def note(what):
    with open({str(journal)!r}, "a") as f:
        f.write(f"{{time.time():.6f}} {{what}} {{os.getpid()}}\\n")
def stop(*_):
    note("stop")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
note("start")
while True:
    signal.pause()
""",
    )
    async with split_cluster(tmp_path) as (link, client, near):

        async def far_ready() -> bool:
            return any(n.name == "far" and n.state == "Ready" for n in await client.nodes())

        await eventually(far_ready, what="the agent in the namespace to join")
        sleeps = script(tmp_path, "sleeps", "import signal\nsignal.pause()\n")
        await client.submit(job_spec("split", leader=leader, worker=sleeps, workers=1))
        first = (await client.wait("split", stages=["Running"], timeout_s=30)).status
        assert first.leader.node == "far"
        near.start()
        await asyncio.wait_for(near.connected.wait(), 30)

        ip("link", "set", link, "down")  # the partition

        async def moved() -> bool:
            st = (await client.get("split")).status
            return st.stage == "Running" and st.leader.node == "near"

        await eventually(moved, timeout_s=60, what="the leader to start again on the other node")
        await eventually(lambda: journal.read_text().count("start") == 2, what="the new leader")
        notes = [line.split() for line in journal.read_text().splitlines()]
        (t_start_old, _, old), (t_stop, _, stopped), (t_start_new, _, new) = sorted(
            (float(t), what, pid) for t, what, pid in notes
        )
        assert [w for _, w, _ in sorted((float(t), w, p) for t, w, p in notes)] == [
            "start",
            "stop",
            "start",
        ]
        assert stopped == old != new and t_start_old < t_stop < t_start_new
        st = (await client.get("split")).status
        assert st.leader_restarts == 0 and st.leader.attempt == 1  # lost: no restart spent
        await client.delete("split")
