"""Heartbeat timing as the cluster grows: pure functions, their invariants (hypothesis), the
controller's node check and the configuration key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from arranger.server.config import FENCE_MARGIN_S, ConfigError, ServerConfig, load_server_config
from arranger.server.controller import Controller, ControllerConfig
from arranger.server.heartbeats import (
    MISSED,
    Cadence,
    agent_period,
    fence_timeout,
    longest,
    node_timeout,
    period,
)
from arranger.server.nodes import NodeRegistration
from arranger.states import NodeState

DEFAULTS = ServerConfig()


@pytest.mark.parametrize(
    ("agents", "period_s", "fence_s", "node_timeout_s"),
    [
        (1, 5.0, 300.0, 330.0),
        (500, 5.0, 300.0, 330.0),
        (1_000, 10.0, 300.0, 330.0),
        (5_000, 50.0, 300.0, 368.5),
        (10_000, 100.0, 375.0, 506.0),
    ],
)
def test_the_defaults_at_the_sizes_the_readme_gives(
    agents: int, period_s: float, fence_s: float, node_timeout_s: float
) -> None:
    p = period(agents, DEFAULTS)
    assert p == period_s
    assert longest(p) == period_s * 1.25
    assert fence_timeout(p, DEFAULTS) == fence_s
    assert node_timeout(p, DEFAULTS) == node_timeout_s


def test_an_agents_period_is_fixed_by_its_name_and_spread() -> None:
    names = [f"gpu-{i:04d}" for i in range(1_000)]
    periods = [agent_period(10.0, name) for name in names]
    assert periods == [agent_period(10.0, name) for name in names], "the same on every call"
    assert all(10.0 <= p < longest(10.0) for p in periods)
    assert min(periods) < 10.2 and max(periods) > 12.3, "spread over the whole quarter"


def test_without_fencing_the_node_timeout_still_lets_three_heartbeats_go_missing() -> None:
    config = dataclasses.replace(DEFAULTS, fence_timeout_s=0.0)
    assert fence_timeout(50.0, config) == 0.0
    assert node_timeout(50.0, config) == 330.0
    assert node_timeout(200.0, config) == MISSED * longest(200.0) == 750.0


def test_a_cadence_never_shortens_while_the_server_runs() -> None:
    cadence = Cadence(DEFAULTS)
    assert (cadence.period_s, cadence.node_timeout_s) == (5.0, 330.0)
    assert not cadence.grow(400), "within heartbeatIntervalSeconds: nothing changes"
    assert cadence.grow(5_000)
    assert (cadence.period_s, cadence.fence_timeout_s, cadence.node_timeout_s) == (
        50.0,
        300.0,
        368.5,
    )
    assert not cadence.grow(10), "agents that left may still wait the period they were told"
    assert cadence.period_s == 50.0 and cadence.agents == 5_000
    assert cadence.agent_period_s("gpu-7") == agent_period(50.0, "gpu-7")


# Invariants, for any cluster and any configuration.

configs = st.builds(
    lambda interval, rate, fence, node: dataclasses.replace(
        DEFAULTS,
        heartbeat_interval_s=interval,
        max_heartbeats_per_second=rate,
        fence_timeout_s=fence,
        controller=ControllerConfig(node_timeout_s=node),
    ),
    st.floats(0.01, 120),
    st.floats(0.001, 100_000),
    st.one_of(st.just(0.0), st.floats(0.5, 7_200)),
    st.floats(1, 10_000),
)
agents = st.integers(0, 10_000_000)


@given(configs, agents, st.text(min_size=1, max_size=20))
def test_all_agents_together_stay_within_the_rate(config: ServerConfig, n: int, node: str) -> None:
    p = period(n, config)
    assert n / p <= config.max_heartbeats_per_second * (1 + 1e-9)
    assert p <= agent_period(p, node) <= longest(p), "each agent's stagger only lengthens"


@given(configs, st.integers(0, 300))
def test_the_staggered_periods_of_every_agent_stay_within_the_rate(
    config: ServerConfig, n: int
) -> None:
    p = period(n, config)
    total = sum(1 / agent_period(p, f"node-{i}") for i in range(n))
    assert total <= config.max_heartbeats_per_second * (1 + 1e-9)


@given(configs, agents)
def test_a_cut_off_agent_has_stopped_its_pods_before_the_node_times_out(
    config: ServerConfig, n: int
) -> None:
    p = period(n, config)
    fence, timeout = fence_timeout(p, config), node_timeout(p, config)
    assert timeout >= config.controller.node_timeout_s
    assert timeout >= MISSED * longest(p), "three heartbeats may go missing"
    if config.fence_timeout_s:
        assert fence >= config.fence_timeout_s
        assert fence >= MISSED * longest(p), "a healthy agent hears three acks within its fence"
        assert fence + longest(p) + FENCE_MARGIN_S <= timeout
    else:
        assert fence == 0.0


@given(configs, agents, agents)
def test_the_timing_is_monotone_in_the_number_of_agents(
    config: ServerConfig, a: int, b: int
) -> None:
    small, large = period(min(a, b), config), period(max(a, b), config)
    assert small <= large
    assert fence_timeout(small, config) <= fence_timeout(large, config)
    assert node_timeout(small, config) <= node_timeout(large, config)


# The controller and the configuration.


def test_the_node_check_uses_the_stretched_node_timeout() -> None:
    controller = Controller(ControllerConfig(node_timeout_s=30.0))
    controller.node_registered(NodeRegistration("n1", "10.0.0.1", 8000, 2**33), 100.0)
    controller.node_timeout_s = 60.0
    controller.check_nodes(100.0 + 45)
    assert controller.nodes["n1"].state == NodeState.READY, "past config's, within the stretched"
    controller.check_nodes(100.0 + 61)
    assert controller.nodes["n1"].state == NodeState.NOT_READY


@pytest.mark.parametrize("value", ["0", "-5", "fast", ".nan", ".inf", "true"])
def test_max_heartbeats_per_second_must_be_a_number_above_zero(tmp_path: Path, value: str) -> None:
    (tmp_path / "server.yaml").write_text(f"insecure: true\nmaxHeartbeatsPerSecond: {value}\n")
    with pytest.raises(ConfigError, match="maxHeartbeatsPerSecond"):
        load_server_config(tmp_path / "server.yaml")
    with pytest.raises(ConfigError, match="maxHeartbeatsPerSecond"):
        dataclasses.replace(DEFAULTS, max_heartbeats_per_second=0.0).check()


def test_max_heartbeats_per_second_is_read(tmp_path: Path) -> None:
    (tmp_path / "server.yaml").write_text("insecure: true\nmaxHeartbeatsPerSecond: 250\n")
    config = load_server_config(tmp_path / "server.yaml")
    assert config.max_heartbeats_per_second == 250.0
    assert period(5_000, config) == 20.0
