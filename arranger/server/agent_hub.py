"""agent_hub: the agents connected to this server, and what their coming and going does
(DESIGN §5.3).

Each node has at most one link (a newer stream of the same agent replaces the older; another
agent is refused the name while it is held, see node_holders). Heartbeats stretch as the most
agents connected at once grows (heartbeats.Cadence), and the controller's node timeout with
them. Stimuli reach the controller through the one path for changes (`commit`).
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from arranger.server.agent_link import AgentLink
from arranger.server.controller import Controller
from arranger.server.heartbeats import Cadence
from arranger.server.node_holders import NodeHolders
from arranger.server.nodes import NodeRegistration, PodReport
from arranger.server.ports import Clock, Closed, Commit
from arranger.v1 import agent_pb2

log = structlog.get_logger("arranger.server")


class AgentHub:
    """AgentHub keeps the links (node name -> AgentLink) and turns an agent's arrival,
    reports and departure into the controller's stimuli. `epoch()` is this server's lease
    epoch while it may act on its lease (None otherwise); `changed(True)` tells the scheduling
    loop to look again at its next periodic cycle."""

    def __init__(
        self,
        controller: Controller,
        heartbeats: Cadence,
        clock: Clock,
        commit: Commit,
        closed: Closed,
        epoch: Callable[[], int | None],
        changed: Callable[[bool], None],
    ) -> None:
        self.controller, self.heartbeats, self._clock = controller, heartbeats, clock
        self._commit, self._closed, self._epoch, self._changed = commit, closed, epoch, changed
        self.links: dict[str, AgentLink] = {}
        self.holders = NodeHolders()  # which agent holds each node name
        self.job_retention_s = 0.0  # what agents are told (Registered.job_retention_s)
        self.stopping = False

    def connected(self, count: int) -> None:
        """connected: `count` agents are connected now. Heartbeats stretch as the most
        connected at once grows, and the node timeout with them (see heartbeats.Cadence)."""
        if self.heartbeats.grow(count):
            self.controller.node_timeout_s = self.heartbeats.node_timeout_s
            log.debug(
                "heartbeats stretched",
                agents=count,
                period_s=self.heartbeats.period_s,
                fence_timeout_s=self.heartbeats.fence_timeout_s,
                node_timeout_s=self.heartbeats.node_timeout_s,
            )

    async def registered(self, reg: NodeRegistration, link: AgentLink) -> None:
        """registered: the agent of `reg` accepted this server; its link is the node's now."""
        if self._closed():  # stepped down (or stopping) since the stream was admitted
            link.close()
            return
        old = self.links.get(reg.name)
        if old is not None and old is not link:
            old.close()
        self.links[reg.name] = link
        self.connected(len(self.links))  # agents registering at once count each other
        fx = self.controller.node_registered(reg, self._clock())
        # The next periodic cycle (within schedulePeriodSeconds) looks at the node, not one
        # soon after each registration: a fleet that registers at once (a server restart)
        # costs a cycle a period, not a cycle over every node per agent.
        later, fx.schedule = fx.schedule, False
        await self._commit(fx)
        self._changed(later)

    def purge_unknown(self, link: AgentLink, kept: tuple[str, ...]) -> None:
        """purge_unknown: an agent that registers keeping directories of jobs this server has
        no record of (pruned or deleted while it was away, or newer than a store restored from
        a backup) is told to remove them once they are older than the jobs' retention."""
        unknown = [job_id for job_id in kept if self.controller.view.job(job_id) is None]
        epoch = self._epoch()
        if not unknown or epoch is None:
            return
        log.info("purging jobs the server no longer has", node=link.node, jobs=len(unknown))
        commands = agent_pb2.Commands(purge_unknown_jobs=unknown, epoch=epoch)
        link.send(agent_pb2.ServerMessage(commands=commands))

    async def disconnected(self, link: AgentLink) -> None:
        """disconnected: the agent's stream ended; the node is told so unless a newer link
        holds it (or this server is stopping or stepping down: it writes nothing)."""
        if self.links.get(link.node) is link:
            del self.links[link.node]
            if not self.stopping and not self._closed():
                await self._commit(self.controller.node_disconnected(link.node, self._clock()))

    async def pod_reports(self, node: str, reports: list[PodReport], full: bool = False) -> None:
        """pod_reports: what the agent says of its pods (`full`: of every pod it holds)."""
        now = self._clock()
        if full:
            await self._commit(self.controller.node_resync(node, reports, now))
        else:
            await self._commit(self.controller.pod_reports(node, reports, now))

    def close_all(self) -> None:
        """close_all ends every agent's stream (they find the active server)."""
        for link in list(self.links.values()):
            link.close()
