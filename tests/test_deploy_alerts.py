"""deploy/alerts.yml: valid Prometheus rules (promtool, where installed: .ci/run installs it),
and every metric they read is one the server or the agent exposes, so no alert waits on a
series that never comes."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from arranger.agent.metrics import AgentMetrics
from arranger.v1 import arranger_pb2
from tests.conftest import bare_server

ALERTS = Path(__file__).resolve().parent.parent / "deploy" / "alerts.yml"
# Exposed only where it applies: the lease, on a store shared by servers (PostgreSQL).
CONDITIONAL = {"arranger_lease_remaining_seconds"}
SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_info")
# What an operator must hear of: slow answers, nodes taking no pods, no agent at all, and
# agents of several releases left after an upgrade.
WATCHED = {
    "arranger_grpc_request_duration_seconds_bucket",
    "arranger_node_schedulable",
    "arranger_agents_connected",
    "arranger_node_agent_info",
}


def rules() -> list[dict[str, object]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_promtool_accepts_the_rules() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: prometheus; .ci/run installs it)")
    ran = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"SUCCESS: {len(rules())} rules found" in ran.stdout


def read(rule: dict[str, object]) -> set[str]:
    return set(re.findall(r"\b(arranger_[a-z_]+)", str(rule["expr"])))


def test_the_rules_watch_latency_nodes_agents_and_releases() -> None:
    unwatched = WATCHED - set().union(*(read(rule) for rule in rules()))
    assert not unwatched, sorted(unwatched)


def test_every_method_a_rule_names_is_served() -> None:
    served = {
        f"{service.full_name}/{method.name}"
        for service in arranger_pb2.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    named = {
        name for rule in rules() for name in re.findall(r'method!?="([^"]+)"', str(rule["expr"]))
    }
    assert named and named <= served, sorted(named - served)


async def test_every_metric_an_alert_reads_is_exposed(tmp_path: Path) -> None:
    async with bare_server(tmp_path / "server") as server:
        text = server.metrics.exposition().decode()
    text += AgentMetrics(lambda: [], lambda: True).exposition().decode()
    exposed = {family.name for family in text_string_to_metric_families(text)} | CONDITIONAL
    missing = sorted(
        name
        for name in set().union(*(read(rule) for rule in rules()))
        if name not in exposed
        and not any(name.endswith(s) and name.removesuffix(s) in exposed for s in SUFFIXES)
    )
    assert not missing, missing
    for rule in rules():
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]  # type: ignore[arg-type]
