"""heartbeats: how often agents heartbeat, and how long the server waits for them, as the
cluster grows. All times in seconds.

As in Nomad (its heartbeat TTL), the period stretches with the number of connected agents so
that all of them together send at most maxHeartbeatsPerSecond:

    period       = max(heartbeatIntervalSeconds, agents / maxHeartbeatsPerSecond)
    an agent's   = period * (1 + STAGGER * s), s in [0, 1) fixed by the node's name
    longest      = period * (1 + STAGGER)
    fence        = max(fenceTimeoutSeconds, MISSED * longest)        (0: never fence)
    node timeout = max(nodeTimeoutSeconds, MISSED * longest, fence + longest + FENCE_MARGIN_S)

The stagger only lengthens a period, so each agent still sends at most 1/period heartbeats a
second. Nomad staggers each heartbeat at random by up to a whole period; here each node's is
fixed by a hash of its name (the same on every server, so tests can know it) and at most a
quarter: agents that register at once (after a server restart) send their next heartbeats
spread over a quarter period, and drift further apart each period after.

MISSED (3) heartbeats, or acks, may go missing before either side gives up: a node is lost
only after three periods of silence, so one heartbeat delayed by a busy server or a slow
network never costs a node, and an agent hears the server (its acks) at least three times
within its fence. So the fence grows too once three periods would pass it (past 8,000 agents
with the defaults), rather than the period stopping short of it: the rate then holds for any
cluster. fence + longest + FENCE_MARGIN_S ≤ node timeout always holds, so the server never
replaces a pod its cut-off agent may still run (see ServerConfig.check); Cadence keeps it true
for agents still holding an earlier, longer timing.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

from arranger.server.config import FENCE_MARGIN_S

if TYPE_CHECKING:
    from arranger.server.config import ServerConfig

STAGGER = 0.25
MISSED = 3


def period(agents: int, config: ServerConfig) -> float:
    """period is the heartbeat period for `agents` connected agents, before each one's stagger:
    at least heartbeatIntervalSeconds, and long enough that they send at most
    maxHeartbeatsPerSecond in all. It never shortens as `agents` grows."""
    return max(config.heartbeat_interval_s, agents / config.max_heartbeats_per_second)


def agent_period(period_s: float, node: str) -> float:
    """agent_period is the period the server tells the agent of `node`: `period_s` stretched
    by the node's stagger, between period_s and longest(period_s)."""
    stagger = zlib.crc32(node.encode()) / 2**32  # in [0, 1), the same on every run
    return period_s * (1 + STAGGER * stagger)


def longest(period_s: float) -> float:
    """longest is the longest period any agent is told for `period_s` (see agent_period)."""
    return period_s * (1 + STAGGER)


def fence_timeout(period_s: float, config: ServerConfig) -> float:
    """fence_timeout is the fence the server tells agents: fenceTimeoutSeconds, or MISSED
    longest periods once that is more (0: fencing is off)."""
    if not config.fence_timeout_s:
        return 0.0
    return max(config.fence_timeout_s, MISSED * longest(period_s))


def node_timeout(period_s: float, config: ServerConfig) -> float:
    """node_timeout is how long the server waits for a silent node before it is NotReady and
    its pods are replaced: nodeTimeoutSeconds, or more as the period grows, so that MISSED
    heartbeats may go missing and the node's agent has stopped its pods before (fence +
    longest + FENCE_MARGIN_S)."""
    timeout = max(config.controller.node_timeout_s, MISSED * longest(period_s))
    fence = fence_timeout(period_s, config)
    if fence:
        timeout = max(timeout, fence + longest(period_s) + FENCE_MARGIN_S)
    return timeout


class Cadence:
    """Cadence is the heartbeat timing of one server run, worked out for the most agents
    connected at once so far (`agents`). It never shortens while the server runs: an agent
    may still wait the longest period it was told, and one of an older version keeps the
    period and fence it registered with, so the node timeout must cover every value told."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.agents = 0
        self.period_s = period(0, config)
        self.fence_timeout_s = fence_timeout(self.period_s, config)
        self.node_timeout_s = node_timeout(self.period_s, config)

    def grow(self, agents: int) -> bool:
        """grow: `agents` are connected now. True if the period grew."""
        if agents <= self.agents:
            return False
        self.agents = agents
        grown = period(agents, self.config)
        if grown == self.period_s:
            return False
        self.period_s = grown
        self.fence_timeout_s = fence_timeout(grown, self.config)
        self.node_timeout_s = node_timeout(grown, self.config)
        return True

    def agent_period_s(self, node: str) -> float:
        """agent_period_s: the period to tell the agent of `node` now."""
        return agent_period(self.period_s, node)
