"""`arranger nodes` shows what each node's agent holds pods to of their GPU grants: whole in
JSON and YAML (`gpuSharing`, false fields included), in short in the table (GPU GUARD)."""

from __future__ import annotations

import json
import re
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import yaml

from arranger.v1 import node_pb2
from tests.client.test_cli import arranger
from tests.conftest import bare_server, eventually
from tests.played_agent import played_agent, registration

SHARING = {
    "both": node_pb2.GpuSharing(
        enforced=True, isolation=True, isolation_detail="cgroup v2 device program"
    ),
    "devices": node_pb2.GpuSharing(isolation=True, isolation_detail="cgroup v1 devices"),
    "open": node_pb2.GpuSharing(),  # said, and all of it false
    "cpu": node_pb2.GpuSharing(isolation_detail="no GPUs"),
}
GUARD = {"both": "devices+shares", "devices": "devices", "open": "none", "older": "?", "cpu": "-"}


def gpus(name: str) -> list[node_pb2.Gpu]:
    if name == "cpu":
        return []
    return [node_pb2.Gpu(index=0, uuid=f"GPU-{name}", model="A100", memory=2**34, fake=True)]


def guard_column(table: str) -> dict[str, str]:
    """guard_column: each node's GPU GUARD cell, by name, from the table as printed."""
    header, *rows = table.splitlines()
    at = header.index("GPU GUARD")
    return {row.split()[0]: row[at:].split()[0] for row in rows if row.strip()}


async def test_nodes_show_what_each_agent_said_of_gpu_sharing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # the table's width when printed into a pipe
    data = tmp_path / "server"
    async with bare_server(data) as server, AsyncExitStack() as agents:
        address = f"127.0.0.1:{server.port}"
        for name in GUARD:
            said = {"gpu_sharing": SHARING[name]} if name in SHARING else {}
            register = registration(name, gpus=gpus(name), **said)
            await agents.enter_async_context(played_agent(address, register))
        await eventually(lambda: len(server.controller.nodes) == len(GUARD), what="5 nodes")
        rc, out, err = await arranger("nodes", "-o", "json", server=address)
        assert rc == 0, err
        shown = {node["name"]: node.get("gpuSharing") for node in json.loads(out)}
        assert shown == {
            "both": {
                "enforced": True,
                "isolation": True,
                "isolationDetail": "cgroup v2 device program",
            },
            "devices": {
                "enforced": False,
                "isolation": True,
                "isolationDetail": "cgroup v1 devices",
            },
            "open": {"enforced": False, "isolation": False, "isolationDetail": ""},
            "older": None,
            "cpu": {"enforced": False, "isolation": False, "isolationDetail": "no GPUs"},
        }
        rc, out, _ = await arranger("nodes", "-o", "yaml", server=address)
        assert {node["name"]: node.get("gpuSharing") for node in yaml.safe_load(out)} == shown
        rc, out, _ = await arranger("nodes", server=address)
        assert guard_column(out) == GUARD, out
    # Kept in memory only: a restarted server does not know until each agent registers again.
    async with bare_server(data) as server:
        rc, out, _ = await arranger("nodes", "-o", "json", server=f"127.0.0.1:{server.port}")
        assert [node.get("gpuSharing") for node in json.loads(out)] == [None] * len(GUARD)
        rc, out, _ = await arranger("nodes", server=f"127.0.0.1:{server.port}")
        assert guard_column(out) == {name: "-" if name == "cpu" else "?" for name in GUARD}, out


async def test_nodes_show_an_agent_gone_from_a_node_still_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    async with bare_server(tmp_path / "server") as server:
        address = f"127.0.0.1:{server.port}"
        async with played_agent(address, registration("stays")):
            async with played_agent(address, registration("leaves")):
                await eventually(lambda: len(server.links) == 2, what="2 agents")
            nodes = server.controller.nodes
            await eventually(lambda: not nodes["leaves"].connected, what="the stream to close")
            rc, out, err = await arranger("nodes", "-o", "json", server=address)
            assert rc == 0, err
            shown = {node["name"]: node for node in json.loads(out)}
            assert shown["leaves"]["state"] == "Ready" == shown["stays"]["state"]
            assert shown["leaves"]["disconnectedSeconds"] > 0
            assert "disconnectedSeconds" not in shown["stays"]
            rc, out, _ = await arranger("nodes", server=address)
            rows = {row.split()[0]: row for row in out.splitlines()[1:] if row.strip()}
            assert re.search(r"\bReady \(disconnected \d+s\)", rows["leaves"]), out
            assert "disconnected" not in rows["stays"]
