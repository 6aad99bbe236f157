"""node_holders: which agent holds each node name, so that two agents never share one.

Each agent sends its own id (made once, kept in its data directory) when it registers. The
first agent to register a name holds it; another id is refused for that name while the
holder is live: its stream is open, or the node has not yet timed out since it was last
heard (a holder on a flaky link keeps its name through the blip). Once the node has timed
out (its pods handled as lost), another agent may take the name: a machine reinstalled
with a fresh data directory joins again. An agent of an older release sends no id and is
admitted as before, holding nothing. The holder is stored with the node (NodeRecord.agent_id)
once it has registered, so a server started again (or a standby taking over) knows it: a twin
that comes back first is refused while the node is still Ready. A name claimed in this
server's life is also held here from the claim on, before its registration is stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class NodeHolders:
    """NodeHolders: node name -> the id of the agent that holds it; `refused` counts
    registrations turned away."""

    _held: dict[str, str] = field(default_factory=dict)
    refused: int = 0

    def claim(self, name: str, agent_id: str, holder_live: bool, stored: str = "") -> str:
        """claim: "" when the agent may register as `name` (it holds the name from now on),
        else why not. `holder_live`: the node's stream is open, or the node is still Ready;
        `stored`: the holder the node's stored record names (the store's word until an agent
        claims the name in this server's life)."""
        holder = self._held.get(name, "") or stored
        if agent_id and holder and holder != agent_id and holder_live:
            self.refused += 1
            return (
                f"register.nodeName: node {name!r} is held by another agent (id {holder[:12]}), "
                f"and this agent (id {agent_id[:12]}) has the same name: a cloned machine or a "
                "copied config? Give each machine its own nodeName (or stop the other agent and "
                "wait for the node to time out)"
            )
        if agent_id:
            self._held[name] = agent_id
        return ""
