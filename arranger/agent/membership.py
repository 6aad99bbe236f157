"""membership: the one cluster an agent obeys, remembered in its data directory.

An agent joins the first cluster whose server admits it and keeps that cluster's id (the id of
the server's store, sent in Registered) in `cluster-id` under its data directory: written whole,
then renamed into place, readable and writable by the agent's user alone. From then on it obeys
only a server that sends the same id. A server of another cluster, or one that sends no id (a
fresh store where the old one was lost, a test server on the wrong port, an older server), is
refused as if it were unreachable: the agent carries out nothing it says, keeps trying, and
fences its pods if no server of its own cluster is heard for fenceTimeout.
"""

from __future__ import annotations

import os
from pathlib import Path

FILE = "cluster-id"


class ForeignServer(Exception):
    """ForeignServer: the server belongs to another cluster than this agent's; says why."""


class Membership:
    """Membership holds the id of this agent's cluster ("" until it joins one)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / FILE
        try:
            self.cluster_id = self.path.read_text().strip()
        except FileNotFoundError:
            self.cluster_id = ""

    def admit(self, offered: str, server: str) -> None:
        """admit accepts a server whose cluster id is this agent's own, or, for an agent that
        belongs to none yet, joins the server's cluster; raises ForeignServer otherwise."""
        if not offered:
            raise ForeignServer(
                f"the server at {server} sent no cluster id: it is not the server of "
                f"{'cluster ' + self.cluster_id if self.cluster_id else 'a cluster'}"
            )
        if self.cluster_id and offered != self.cluster_id:
            raise ForeignServer(
                f"the server at {server} serves cluster {offered}, and this agent belongs to "
                f"cluster {self.cluster_id} ({self.path}): it obeys no other"
            )
        if not self.cluster_id:
            self._remember(offered)

    def _remember(self, cluster_id: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        part = self.path.with_name(FILE + ".part")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(part, flags, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, cluster_id.encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        part.replace(self.path)
        self.cluster_id = cluster_id
