"""membership: the one cluster an agent obeys, remembered in its data directory.

An agent joins the first cluster whose server admits it and keeps that cluster's id (the id of
the server's store, sent in Registered) in `cluster-id` under its data directory: written whole,
then renamed into place, readable and writable by the agent's user alone. From then on it obeys
only a server that sends the same id. A server of another cluster, or one that sends no id (a
fresh store where the old one was lost, a test server on the wrong port, an older server), is
refused as if it were unreachable: the agent carries out nothing it says, keeps trying, and
fences its pods if no server of its own cluster is heard for fenceTimeout.

The agent's own id (`agent-id`, made once, random) tells the server which agent holds a node
name: a second agent with the same name (a cloned machine, a copied config) is refused while
the first holds it, rather than taking the node's pods over.

Servers that share a store take turns by a lease whose epoch only grows (see the server's
leadership). The agent remembers the highest epoch it was admitted at, in `epoch` beside the
cluster id, and obeys no server of an older one: a server that lost its lease and does not yet
know it (frozen, cut off) is refused like a server of another cluster, and so are orders that
carry an older epoch.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

FILE = "cluster-id"
EPOCH_FILE = "epoch"
ID_FILE = "agent-id"


class ForeignServer(Exception):
    """ForeignServer: the server belongs to another cluster than this agent's; says why."""


class Membership:
    """Membership holds the id of this agent's cluster ("" until it joins one)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / FILE
        self.epoch_path = data_dir / EPOCH_FILE
        self.cluster_id = _read(self.path)
        self.epoch = int(_read(self.epoch_path) or 0)
        id_path = data_dir / ID_FILE
        self.agent_id = _read(id_path)
        if not self.agent_id:
            self.agent_id = uuid.uuid4().hex
            _remember(id_path, self.agent_id)

    def admit(self, offered: str, server: str, epoch: int = 0) -> None:
        """admit accepts a server whose cluster id is this agent's own, or, for an agent that
        belongs to none yet, joins the server's cluster, at an epoch no older than the last
        one admitted (which it remembers); raises ForeignServer otherwise."""
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
        if epoch < self.epoch:
            raise ForeignServer(
                f"the server at {server} is of epoch {epoch}, and this agent obeyed a server of "
                f"epoch {self.epoch}: another server took its place"
            )
        if not self.cluster_id:
            _remember(self.path, offered)
            self.cluster_id = offered
        if epoch > self.epoch:
            _remember(self.epoch_path, str(epoch))
            self.epoch = epoch

    def current(self, epoch: int) -> bool:
        """current: orders of this epoch may be carried out (none older than the last admitted)."""
        return epoch >= self.epoch


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


def _remember(path: Path, value: str) -> None:
    """_remember writes `value` to `path` whole (then renamed into place), for the agent's user
    alone."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(part, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, value.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    part.replace(path)
