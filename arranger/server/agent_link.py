"""agent_link is the server's end of one agent's stream: an outbox and log relays."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

from arranger.v1 import agent_pb2

_request_ids = itertools.count(1)


class AgentGone(ConnectionError):
    """AgentGone: the agent's stream closed while something was waiting on it."""


class AgentLink:
    """AgentLink queues messages to one connected agent and routes its log replies.

    Messages are sent in the order they are queued; `close()` ends the stream.
    """

    def __init__(self, node: str) -> None:
        self.node = node
        self.outbox: asyncio.Queue[agent_pb2.ServerMessage | None] = asyncio.Queue()
        self._logs: dict[int, asyncio.Queue[agent_pb2.LogData | None]] = {}
        self.closed = False

    def send(self, msg: agent_pb2.ServerMessage) -> None:
        if not self.closed:
            self.outbox.put_nowait(msg)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.outbox.put_nowait(None)
        for queue in self._logs.values():
            queue.put_nowait(None)

    def on_log_data(self, msg: agent_pb2.LogData) -> None:
        queue = self._logs.get(msg.request_id)
        if queue is not None:
            queue.put_nowait(msg)

    async def logs(
        self, pod_uid: str, attempt: int, follow: bool, tail_bytes: int
    ) -> AsyncIterator[bytes]:
        """logs yields a pod attempt's log as the agent sends it, until it says end of file."""
        request_id = next(_request_ids)
        queue: asyncio.Queue[agent_pb2.LogData | None] = asyncio.Queue()
        self._logs[request_id] = queue
        self.send(
            agent_pb2.ServerMessage(
                log_request=agent_pb2.LogRequest(
                    request_id=request_id, pod_uid=pod_uid, attempt=attempt, follow=follow,
                    tail_bytes=tail_bytes,
                )
            )
        )  # fmt: skip
        finished = False
        try:
            while True:
                data = await queue.get()
                if data is None:
                    raise AgentGone(f"node {self.node} disconnected")
                if data.error:
                    finished = True
                    raise FileNotFoundError(data.error)
                if data.data:
                    yield data.data
                if data.eof:
                    finished = True
                    return
        finally:
            del self._logs[request_id]
            if not finished:
                cancel = agent_pb2.LogCancel(request_id=request_id)
                self.send(agent_pb2.ServerMessage(log_cancel=cancel))
