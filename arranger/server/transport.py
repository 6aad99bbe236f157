"""transport: the server's gRPC endpoint: its services, how it is tuned for a fleet of agents
and many users, and the standard health service it answers beside its own."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from arranger.server import reflection
from arranger.v1 import agent_pb2, agent_pb2_grpc, arranger_pb2, arranger_pb2_grpc

SERVICES = (  # the server's own services, by full name
    arranger_pb2.DESCRIPTOR.services_by_name["Arranger"].full_name,
    agent_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name,
)
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name

SEND_LIMIT = 64 * 2**20  # the largest reply (ListNodes of ~150,000 nodes)
AGENT_PING_MIN_INTERVAL_MS = 5_000  # pings closer than this, with no data between, strike
KEEPALIVE_MS, KEEPALIVE_TIMEOUT_MS = 60_000, 20_000
PENDING_CALLS = 100_000  # calls gRPC holds until the event loop picks them up
PENDING_CALL_WAIT_S = 300  # how long one may wait there before gRPC drops it


def server_options(receive_limit: int) -> list[tuple[str, int]]:
    """server_options: the gRPC server's options, taking requests up to `receive_limit`."""
    return [
        ("grpc.max_receive_message_length", receive_limit),
        ("grpc.max_send_message_length", SEND_LIMIT),
        ("grpc.so_reuseport", 0),
        # Agents ping every 10 s on their stream (a dead peer shows in seconds), which may
        # carry no message for longer (a stretched heartbeat period); gRPC's default
        # (5 minutes) would answer the third such ping "too many pings" and drop the
        # connection.
        ("grpc.http2.min_ping_interval_without_data_ms", AGENT_PING_MIN_INTERVAL_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        # The server pings each connection quiet for a minute, and drops it unanswered for
        # 20 s: a caller gone without a word (a laptop asleep) ends its streams (an exec's
        # command with them) in minutes, not TCP's hours.
        ("grpc.keepalive_time_ms", KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        # gRPC core refuses new calls at random once more than 1,000 wait for the application
        # to pick them up (all of them past 3,000), and drops any that waited 30 s: a fleet of
        # agents reconnecting at once (a server restart) is more than that, and each refused
        # agent comes back later to wait again. The event loop takes calls in order at its
        # own pace instead.
        ("grpc.server.max_pending_requests", PENDING_CALLS),
        ("grpc.server.max_pending_requests_hard_limit", PENDING_CALLS),
        ("grpc.server_max_unrequested_time_in_server", PENDING_CALL_WAIT_S),
    ]


class Health:
    """Health: gRPC's health service on `server`, answering for the server as a whole ("")
    and for each of `services` by name, all alike."""

    def __init__(self, server: grpc.aio.Server, services: tuple[str, ...]) -> None:
        self._checker = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._checker, server)
        self._names = ("", *services)

    async def set(self, serving: bool) -> None:
        """set: SERVING or NOT_SERVING, for the server and each of its services."""
        status = health_pb2.HealthCheckResponse
        for name in self._names:
            await self._checker.set(name, status.SERVING if serving else status.NOT_SERVING)


def grpc_server(
    interceptors: list[grpc.aio.ServerInterceptor],
    receive_limit: int,
    api: arranger_pb2_grpc.ArrangerServicer,
    agents: agent_pb2_grpc.AgentServiceServicer,
) -> tuple[grpc.aio.Server, Health]:
    """grpc_server: an endpoint serving the client API and the agent protocol through
    `interceptors`, with health (NOT_SERVING until told otherwise) and reflection."""
    server = grpc.aio.server(interceptors=interceptors, options=server_options(receive_limit))
    arranger_pb2_grpc.add_ArrangerServicer_to_server(api, server)
    agent_pb2_grpc.add_AgentServiceServicer_to_server(agents, server)
    served = Health(server, SERVICES)
    reflection.enable([*SERVICES, HEALTH_SERVICE], server)
    return server, served
