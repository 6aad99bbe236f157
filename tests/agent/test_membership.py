"""An agent remembers the first cluster it joins and obeys no server of another."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from arranger.agent.membership import ForeignServer, Membership


def test_an_agent_joins_the_first_cluster_and_refuses_any_other(tmp_path: Path) -> None:
    first = Membership(tmp_path / "agent")
    assert first.cluster_id == ""
    first.admit("cluster-a", "head:50052")
    remembered = tmp_path / "agent" / "cluster-id"
    assert remembered.read_text().strip() == "cluster-a"
    assert stat.S_IMODE(remembered.stat().st_mode) == 0o600
    assert not list((tmp_path / "agent").glob("*.part"))

    again = Membership(tmp_path / "agent")  # the next agent over the same data directory
    again.admit("cluster-a", "head:50052")
    with pytest.raises(ForeignServer, match="serves cluster cluster-b"):
        again.admit("cluster-b", "other:50052")
    with pytest.raises(ForeignServer, match="sent no cluster id"):
        again.admit("", "old:50052")
    assert Membership(tmp_path / "agent").cluster_id == "cluster-a"


def test_a_server_without_a_cluster_id_is_never_joined(tmp_path: Path) -> None:
    new = Membership(tmp_path / "agent")
    with pytest.raises(ForeignServer, match="sent no cluster id"):
        new.admit("", "old:50052")
    assert not (tmp_path / "agent" / "cluster-id").exists()
