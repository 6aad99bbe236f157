"""What an agent reports as its node's size: found, declared (`capacity`), shared, reserved."""

from __future__ import annotations

from pathlib import Path

import pytest

from arranger.agent.config import AgentConfig, AgentConfigError, load_agent_config
from arranger.agent.discovery import Capacity
from arranger.agent.node import capacity_of

FOUND = Capacity(cpu_milli=2000, memory_bytes=8 * 2**30)


def test_an_agent_reports_the_machine_it_found_less_its_reserve() -> None:
    config = AgentConfig(reserve_cpu_milli=500, reserve_memory_bytes=2**30)
    assert capacity_of(config, FOUND) == Capacity(1500, 7 * 2**30)


def test_a_declared_capacity_replaces_what_was_found(tmp_path: Path) -> None:
    settings = tmp_path / "agent.yaml"
    settings.write_text("capacity: {cpu: 50, memory: 64Gi}\nreserve: {cpu: 1}\n")
    config = load_agent_config(settings)
    assert capacity_of(config, FOUND) == Capacity(49_000, 64 * 2**30)
    settings.write_text("capacity: {cpu: 500m}\n")  # memory stays as found
    assert capacity_of(load_agent_config(settings), FOUND) == Capacity(500, 8 * 2**30)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("{cpu: 0}", "capacity.cpu: must be above 0"),
        ("{memory: 0Gi}", "capacity.memory: must be above 0"),
        ("{cpu: lots}", "capacity.cpu: invalid quantity"),
        ("{gpu: 8}", "capacity: must be a mapping of cpu and/or memory"),
        ("{}", "capacity: must be a mapping of cpu and/or memory"),
        ("50", "capacity: must be a mapping of cpu and/or memory"),
    ],
)
def test_a_declared_capacity_is_checked(tmp_path: Path, value: str, error: str) -> None:
    settings = tmp_path / "agent.yaml"
    settings.write_text(f"capacity: {value}\n")
    with pytest.raises(AgentConfigError, match=error):
        load_agent_config(settings)
