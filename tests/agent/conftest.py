"""Fixtures the agent's tests share."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from arranger.agent.cgroups import Cgroups


@pytest.fixture
def cgroups() -> Iterator[Cgroups]:
    """cgroups: this test process's own cgroups (skipped where they cannot be written); none
    of its pods' cgroups may be left after the test."""
    found, why = Cgroups.detect(f"test-{os.getpid()}")
    if found is None:
        pytest.skip(f"cgroups cannot be used here: {why}")
    yield found
    found.close()
    assert not any(base.exists() for base in found.bases.values()), "pod cgroups were left"
