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
from tests.conftest import bare_server

ALERTS = Path(__file__).resolve().parent.parent / "deploy" / "alerts.yml"
# Exposed only where it applies: the lease, on a store shared by servers (PostgreSQL).
CONDITIONAL = {"arranger_lease_remaining_seconds"}
SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_info")


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


async def test_every_metric_an_alert_reads_is_exposed(tmp_path: Path) -> None:
    async with bare_server(tmp_path / "server") as server:
        text = server.metrics.exposition().decode()
    text += AgentMetrics(lambda: [], lambda: True).exposition().decode()
    exposed = {family.name for family in text_string_to_metric_families(text)} | CONDITIONAL
    read = {
        name for rule in rules() for name in re.findall(r"\b(arranger_[a-z_]+)", str(rule["expr"]))
    }
    missing = sorted(
        name
        for name in read
        if name not in exposed
        and not any(name.endswith(s) and name.removesuffix(s) in exposed for s in SUFFIXES)
    )
    assert not missing, missing
    for rule in rules():
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]  # type: ignore[arg-type]
