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


def test_a_server_of_an_older_epoch_is_refused_across_restarts(tmp_path: Path) -> None:
    agent = Membership(tmp_path / "agent")
    agent.admit("cluster-a", "head-a:50052", epoch=5)
    agent.admit("cluster-a", "head-b:50052", epoch=7)  # head-b took the lease over
    assert agent.current(7) and agent.current(8) and not agent.current(5)
    again = Membership(tmp_path / "agent")  # the next agent over the same data directory
    assert again.epoch == 7
    with pytest.raises(
        ForeignServer, match="of epoch 5, and this agent obeyed a server of epoch 7"
    ):
        again.admit("cluster-a", "head-a:50052", epoch=5)  # head-a, resumed, does not know
    again.admit("cluster-a", "head-a:50052", epoch=9)  # it took the lease back since
    assert Membership(tmp_path / "agent").epoch == 9
    epoch_file = tmp_path / "agent" / "epoch"
    assert stat.S_IMODE(epoch_file.stat().st_mode) == 0o600
