"""Every test here runs a real server, agents and processes: each is marked `e2e`, so that
`pytest -m "not e2e"` leaves them out (see CONTRIBUTING.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.e2e)
