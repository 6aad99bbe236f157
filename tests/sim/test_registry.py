"""The simulator's baselines live in a registry of their own: importing the simulator leaves the
production plugin registry as it was, and a server's config cannot name them."""

from __future__ import annotations

import subprocess
import sys

import pytest

import arranger.sched.plugins  # noqa: F401 (registers the core's plugins)
from arranger.sched.config import SchedulerConfig, SchedulerConfigError
from arranger.sched.framework import PLUGINS


def test_importing_the_simulator_registers_no_production_plugin() -> None:
    before = set(PLUGINS)
    import arranger.sim.main  # noqa: F401, PLC0415
    from arranger.sim.policies import BASELINES, SIM_PLUGINS, SimSession  # noqa: PLC0415

    assert set(PLUGINS) == before
    assert set(BASELINES.values()) == set(SIM_PLUGINS)
    assert not set(SIM_PLUGINS) & set(PLUGINS)
    assert all(name in SimSession.registry for name in [*SIM_PLUGINS, *PLUGINS])


def test_a_fresh_process_sees_no_baseline_after_importing_the_simulator() -> None:
    code = (
        "import arranger.sim.main, arranger.sim.policies\n"
        "from arranger.sched.framework import PLUGINS\n"
        "print(sorted(n for n in PLUGINS if n.startswith('sim-')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_server_config_cannot_name_a_baseline() -> None:
    import arranger.sim.policies  # noqa: F401, PLC0415

    config = SchedulerConfig(tiers=(("predicates", "sim-fgd"),))
    with pytest.raises(SchedulerConfigError, match="unknown plugin 'sim-fgd'"):
        config.check()
