"""The example configuration files in deploy/ are accepted by the loaders they document."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from arranger.agent.config import load_agent_config
from arranger.sched import SchedulerConfig
from arranger.security import TlsFiles
from arranger.server.config import ConfigError, ServerConfig, load_server_config

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def test_the_example_server_config_is_the_defaults_with_tls() -> None:
    config = load_server_config(DEPLOY / "server.yaml")  # scheduler.yaml too
    assert dataclasses.replace(config, tls=None) == ServerConfig()
    assert config.tls == TlsFiles(
        DEPLOY / "tls/ca.pem", DEPLOY / "tls/server.pem", DEPLOY / "tls/server.key"
    )


def test_a_server_config_without_tls_must_say_insecure(tmp_path: Path) -> None:
    (tmp_path / "server.yaml").write_text("listen: 127.0.0.1:0\n")
    with pytest.raises(ConfigError, match="set tls"):
        load_server_config(tmp_path / "server.yaml")
    assert load_server_config(tmp_path / "server.yaml", insecure=True).tls is None
    (tmp_path / "server.yaml").write_text("insecure: true\n")
    assert load_server_config(tmp_path / "server.yaml").tls is None


def test_pods_reach_every_server_listed_in_api_addresses(tmp_path: Path) -> None:
    file = tmp_path / "server.yaml"
    file.write_text("insecure: true\nadvertise: head-a:50051\n")
    assert load_server_config(file).api_for_pods(50051) == "head-a:50051"
    file.write_text("insecure: true\napiAddresses: [head-a:50051, 'head-b:50051']\n")
    assert load_server_config(file).api_for_pods(50051) == "head-a:50051,head-b:50051"
    file.write_text("insecure: true\napiAddresses: head-a:50051,head-b:50051\n")
    assert load_server_config(file).api_addresses == ("head-a:50051", "head-b:50051")
    for bad in ("[head-a]", "[':50051']", "[head-a:99999]", "{a: 1}", "['head a:50051']"):
        file.write_text(f"insecure: true\napiAddresses: {bad}\n")
        with pytest.raises(ConfigError, match="apiAddresses: "):
            load_server_config(file)
    for key in ("maxEvictionNoticeSeconds", "maxPreemptionGraceSeconds", "killGraceSeconds"):
        file.write_text(f"insecure: true\n{key}: soon\n")
        with pytest.raises(ConfigError, match=f"{key}: 'soon' is not a number"):
            load_server_config(file)
    for key in ("maxEvictionNoticeSeconds", "maxPreemptionGraceSeconds"):
        for value in ("-1", ".nan", ".inf"):
            file.write_text(f"insecure: true\n{key}: {value}\n")
            with pytest.raises(ConfigError, match=f"{key} .* must be a number of seconds"):
                load_server_config(file)


def test_the_example_agent_config_loads() -> None:
    config = load_agent_config(DEPLOY / "agent.yaml")
    assert config.server == "head-node:50052" and config.labels == {"zone": "a"}
    assert config.reserve_cpu_milli == 1000 and config.reserve_memory_bytes == 4 * 2**30
    assert config.tls is not None and config.tls.cert == DEPLOY / "tls/gpu-07.pem"
    assert config.podman == "podman" and config.image_pull == "missing"
    assert (config.run_as, config.user, config.run_as_root) == ("owner", "", False)
    assert config.max_log_bytes == 2**30


def test_the_example_scheduler_config_is_the_defaults() -> None:
    config = load_server_config(DEPLOY / "server.yaml")
    assert config.scheduler == SchedulerConfig()


def test_a_scheduler_config_naming_an_unknown_plugin_is_refused(tmp_path: Path) -> None:
    (tmp_path / "scheduler.yaml").write_text("tiers: [{plugins: [priority, magic]}]\n")
    (tmp_path / "server.yaml").write_text("schedulerConfig: scheduler.yaml\n")
    with pytest.raises(ConfigError, match="unknown plugin 'magic'"):
        load_server_config(tmp_path / "server.yaml")
