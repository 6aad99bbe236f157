"""The example configuration files in deploy/ are accepted by the loaders they document."""

from __future__ import annotations

from pathlib import Path

from arranger.agent.config import load_agent_config
from arranger.server.config import ServerConfig, load_server_config

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def test_the_example_server_config_is_the_defaults() -> None:
    assert load_server_config(DEPLOY / "server.yaml") == ServerConfig()


def test_the_example_agent_config_loads() -> None:
    config = load_agent_config(DEPLOY / "agent.yaml")
    assert config.server == "head-node:50051" and config.labels == {"zone": "a"}
    assert config.reserve_cpu_milli == 1000 and config.reserve_memory_bytes == 4 * 2**30
