"""The systemd units in deploy/: the server's sandboxed (it needs its state directory and the
network, nothing else), the agent's left open where its pods would inherit a sandbox, both
restarted however often they fail. Where systemd-analyze is installed, its offline security
review rates the server's unit."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parent.parent / "deploy" / "systemd"
README = UNITS.parent.parent / "README.md"
SANDBOX = (
    "NoNewPrivileges",
    "ProtectSystem",
    "ProtectHome",
    "PrivateTmp",
    "PrivateDevices",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectControlGroups",
    "RestrictNamespaces",
    "RestrictSUIDSGID",
    "SystemCallFilter",
    "CapabilityBoundingSet",
)


def settings(unit: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in (UNITS / unit).read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            key, value = line.split("=", 1)
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def test_the_server_unit_is_sandboxed_and_always_restarted() -> None:
    server = settings("arranger-server.service")
    missing = [key for key in SANDBOX if key not in server]
    assert not missing, missing
    assert server["ProtectSystem"] == ["strict"] and server["NoNewPrivileges"] == ["yes"]
    assert server["StartLimitIntervalSec"] == ["0"] and server["Restart"] == ["always"]


def test_the_server_unit_reads_the_pgpass_file_the_readme_names() -> None:
    # ProtectHome hides ~arranger/.pgpass from the server: the password file lies in its
    # state directory, where PGPASSFILE points libpq, and README sends users there alone.
    server = settings("arranger-server.service")
    environment = dict(
        word.split("=", 1) for line in server["Environment"] for word in line.split()
    )
    pgpass = environment.get("PGPASSFILE", "")
    assert pgpass.startswith(f"/var/lib/{server['StateDirectory'][0]}/"), pgpass
    named = set(re.findall(r"[~/][\w/.-]*\.pgpass", README.read_text()))
    assert named == {pgpass}, named


def test_the_agent_unit_gives_its_pods_nothing_they_would_inherit() -> None:
    agent = settings("arranger-agent.service")
    inherited = [key for key in SANDBOX if key in agent]
    assert not inherited, inherited
    assert agent["TasksMax"] == ["infinity"] and agent["KillMode"] == ["process"]
    assert agent["StartLimitIntervalSec"] == ["0"] and agent["Restart"] == ["always"]
    assert agent["OOMPolicy"] == ["continue"]  # a pod killed for memory leaves the agent


def test_systemd_rates_the_server_unit_ok() -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    ran = subprocess.run(
        [analyze, "security", "--offline=yes", str(UNITS / "arranger-server.service")],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    level = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", ran.stdout)
    if level is None:
        pytest.skip(f"this systemd-analyze cannot review a unit offline: {ran.stderr.strip()}")
    assert float(level.group(1)) <= 2.0 and level.group(2) == "OK", ran.stdout
