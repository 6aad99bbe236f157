"""agent_link is the server's end of one agent's stream: an outbox and log requests."""

from __future__ import annotations

import asyncio
import itertools

from arranger.v1 import agent_pb2

_request_ids = itertools.count(1)


class AgentGone(ConnectionError):
    """AgentGone: the agent's stream closed while something was waiting on it."""


class AgentLink:
    """AgentLink queues messages to one connected agent and matches its log replies to the
    requests waiting for them. Messages are sent in the order they are queued; `close()`
    ends the stream."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.outbox: asyncio.Queue[agent_pb2.ServerMessage | None] = asyncio.Queue()
        self._logs: dict[int, asyncio.Future[agent_pb2.LogData]] = {}
        self.closed = False

    def send(self, msg: agent_pb2.ServerMessage) -> None:
        if not self.closed:
            self.outbox.put_nowait(msg)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.outbox.put_nowait(None)
        for future in self._logs.values():
            if not future.done():
                future.set_exception(AgentGone(f"node {self.node} disconnected"))

    def on_log_data(self, msg: agent_pb2.LogData) -> None:
        future = self._logs.get(msg.request_id)
        if future is not None and not future.done():
            future.set_result(msg)

    async def read_log(
        self, pod_uid: str, attempt: int, offset: int, max_bytes: int, wait_s: float
    ) -> agent_pb2.LogData:
        """read_log asks the agent for one chunk of a pod attempt's log."""
        if self.closed:
            raise AgentGone(f"node {self.node} disconnected")
        request_id = next(_request_ids)
        # Made first: a value out of range raises here and leaves no future behind.
        request = agent_pb2.LogRequest(
            request_id=request_id,
            pod_uid=pod_uid,
            attempt=attempt,
            offset=offset,
            max_bytes=max_bytes,
            wait_s=wait_s,
        )
        future: asyncio.Future[agent_pb2.LogData] = asyncio.get_running_loop().create_future()
        self._logs[request_id] = future
        try:
            self.send(agent_pb2.ServerMessage(log_request=request))
            return await future
        finally:
            del self._logs[request_id]
