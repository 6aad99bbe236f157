"""agent_service serves arranger.v1.AgentService: one bidirectional stream per agent."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import structlog

from arranger.server.agent_hub import AgentHub
from arranger.server.agent_link import AgentLink
from arranger.server.agent_messages import (
    gpu_problems_of,
    registration_from_proto,
    report_from_proto,
)
from arranger.server.controller import Controller
from arranger.server.exec_relay import ExecRelay
from arranger.server.idle_gpus import IdleWatch
from arranger.server.metrics import ServerMetrics
from arranger.server.packages import PackageRefused, Packages
from arranger.server.ports import Clock, Commit
from arranger.server.store import Store, StoreError
from arranger.server.usage import Sample, UsageBook, samples_of
from arranger.states import NodeState
from arranger.v1 import agent_pb2, agent_pb2_grpc

Context = grpc.aio.ServicerContext[Any, Any]
log = structlog.get_logger("arranger.server")
_NODE_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


class AgentServicer(agent_pb2_grpc.AgentServiceServicer):
    """AgentServicer admits an agent on its Register, then relays both ways until it leaves.
    With `tls`, an agent is the node its client certificate names."""

    def __init__(
        self,
        hub: AgentHub,
        commit: Commit,
        clock: Clock,
        store: Callable[[], Store],
        packages: Packages,
        usage: UsageBook,
        metrics: ServerMetrics,
        tls: bool,
        execs: ExecRelay | None = None,
        idle: IdleWatch | None = None,
    ) -> None:
        self.hub, self.controller, self._commit, self._clock = hub, hub.controller, commit, clock
        self.execs = execs if execs is not None else ExecRelay()
        self.idle = idle if idle is not None else IdleWatch(usage)
        self._store, self.packages, self._usage = store, packages, usage
        self._metrics, self._tls = metrics, tls

    async def FetchPackage(
        self, request: agent_pb2.FetchPackageRequest, context: Context
    ) -> AsyncIterator[agent_pb2.PackageData]:
        """FetchPackage streams a package to the agent of a node that holds a pod of a job
        that names it; with TLS, the node its certificate names."""
        node = request.node_name
        if self._tls:
            names = list(context.auth_context().get("x509_common_name") or [b""])
            node = names[0].decode(errors="replace")
        try:
            async for data in self.packages.fetch(request.sha256, node):
                yield agent_pb2.PackageData(data=data)
        except PackageRefused as exc:
            await context.abort(grpc.StatusCode[exc.code], exc.message)

    async def Exec(
        self, request_iterator: AsyncIterator[agent_pb2.ExecFromAgent], context: Context
    ) -> AsyncIterator[agent_pb2.ExecToAgent]:
        """Exec carries the command of one ExecOrder (see exec_relay): its first message names
        the order, which must have been sent to the calling node (with TLS, the node its
        certificate names); then the user's input goes out until the user's call ends."""
        requests = aiter(request_iterator)
        first = await anext(requests, None)
        if first is None or first.WhichOneof("body") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "hello: the first message")
            return
        node = first.hello.node_name
        if self._tls:
            names = list(context.auth_context().get("x509_common_name") or [b""])
            node = names[0].decode(errors="replace")
        session = self.execs.claim(first.hello.exec_id, node, requests)
        if session is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"hello.execId: no command was ordered of node {node}"
            )
            return
        while (msg := await session.to_agent.get()) is not None:
            yield msg

    async def Connect(
        self,
        request_iterator: AsyncIterator[agent_pb2.AgentMessage],
        context: Context,
    ) -> AsyncIterator[agent_pb2.ServerMessage]:
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("body") != "register":
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "the first message must be register"
            )
            return
        reg = first.register
        if not _NODE_NAME.fullmatch(reg.node_name):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"register.nodeName: {reg.node_name!r} is not a node name",
            )
        if self._tls:
            # With mutual TLS an agent is the node its certificate names, and no other.
            names = list(context.auth_context().get("x509_common_name") or [b""])
            if names[0].decode(errors="replace") != reg.node_name:
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"register.nodeName: {reg.node_name!r} is not the node this agent's "
                    "certificate was made for",
                )
                return
        try:
            registration = registration_from_proto(reg)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"register: {exc}")
            return
        hub = self.hub
        why = self._holder_refusal(registration.name, registration.agent_id)
        if why:
            log.warning("agent refused", node=registration.name, peer=context.peer(), error=why)
            self._metrics.agent_refused("node_name_held")
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, why)
            return
        link = AgentLink(registration.name)
        hub.connected(len(hub.links) + (registration.name not in hub.links))
        store = self._store()
        yield agent_pb2.ServerMessage(
            registered=agent_pb2.Registered(
                heartbeat_interval_s=hub.heartbeats.agent_period_s(registration.name),
                fence_timeout_s=hub.heartbeats.fence_timeout_s,
                cluster_id=store.cluster_id,
                epoch=store.epoch or 0,
                job_retention_s=hub.job_retention_s,
            )
        )
        # The node is the agent's only once the agent has accepted this server (it refuses
        # one of another cluster, or of an older epoch, by closing the stream): its first
        # message after Registered says so. Until then it is neither Ready nor schedulable.
        accepted = await anext(aiter(request_iterator), None)
        if accepted is None:
            log.warning(
                "agent did not accept this server", node=registration.name, peer=context.peer()
            )
            self._metrics.agent_refused("not_accepted")
            return
        await hub.registered(registration, link)
        log.info("agent connected", node=link.node, address=registration.address)
        hub.purge_unknown(link, registration.kept_jobs)
        reader = asyncio.create_task(self._read(request_iterator, link, accepted))
        try:
            while True:
                msg = await link.outbox.get()
                if msg is None:
                    break
                yield msg
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            link.close()
            await hub.disconnected(link)
            log.info("agent disconnected", node=link.node)

    def _holder_refusal(self, name: str, agent_id: str) -> str:
        """_holder_refusal: why another agent holds the node name ("" if this one may have it;
        see node_holders)."""
        node = self.controller.nodes.get(name)
        live = name in self.hub.links or (node is not None and node.state == NodeState.READY)
        stored = node.agent_id if node is not None else ""
        return self.hub.holders.claim(name, agent_id, live, stored)

    def _ack(self, node: str) -> agent_pb2.HeartbeatAck:
        """_ack answers a heartbeat with the timing now: the cluster may have grown since."""
        heartbeats = self.hub.heartbeats
        return agent_pb2.HeartbeatAck(
            heartbeat_interval_s=heartbeats.agent_period_s(node),
            fence_timeout_s=heartbeats.fence_timeout_s,
        )

    async def _read(
        self,
        requests: AsyncIterator[agent_pb2.AgentMessage],
        link: AgentLink,
        first: agent_pb2.AgentMessage,
    ) -> None:
        controller, clock = self.controller, self._clock
        try:
            async for msg in _chain(first, requests):
                controller.seen(link.node, clock())
                kind = msg.WhichOneof("body")
                if kind == "heartbeat" and msg.heartbeat.HasField("usage"):
                    beat = msg.heartbeat
                    held = beat.gpu_sharing.enforced if beat.HasField("gpu_sharing") else None
                    fx = controller.heartbeat(
                        link.node,
                        beat.usage.cpu_percent,
                        beat.usage.memory_used,
                        clock(),
                        beat.sent_at,
                        held,
                    )
                    problems = gpu_problems_of(beat.gpu_problems)
                    fx.merge(controller.gpu_problems(link.node, problems, clock()))
                    link.send(agent_pb2.ServerMessage(heartbeat_ack=self._ack(link.node)))
                    if fx:  # a change of share enforcement or GPU health: an event, a cycle
                        await self._commit(fx)
                elif kind == "pod_reports":
                    try:
                        reports = [report_from_proto(r) for r in msg.pod_reports.reports]
                    except ValueError as exc:
                        log.warning("bad pod report", node=link.node, error=str(exc))
                        continue
                    try:
                        await self.hub.pod_reports(link.node, reports, full=msg.pod_reports.full)
                    except StoreError as exc:  # the agent resends; its stream stays
                        log.error("pod reports not stored", node=link.node, error=str(exc))
                elif kind == "log_data":
                    link.on_log_data(msg.log_data)
                elif kind == "usage":
                    samples = samples_of(msg.usage, clock())
                    self._usage.report(link.node, samples, controller.view)
                    await watch_idle(
                        self.idle, controller, self._commit, link.node, samples, clock()
                    )
        except grpc.aio.AioRpcError:
            pass
        except Exception:
            log.exception("agent stream failed", node=link.node)
        finally:
            link.close()


IDLE_STOPPER = "arranger (idle GPUs)"  # who stopped a job for its queue's idleGpuStopMinutes


async def watch_idle(
    idle: IdleWatch,
    controller: Controller,
    commit: Commit,
    node: str,
    samples: list[tuple[str, Sample]],
    now: float,
) -> None:
    """watch_idle: what `node`'s usage readings say of idle GPUs (see idle_gpus), stored; a
    write that fails is logged (the next readings decide again)."""
    fx = idle.observe(
        node,
        samples,
        controller.view,
        controller.queues.get,
        lambda job, at, _why: controller.stop(job, at, IDLE_STOPPER),
        now,
    )
    if fx:
        try:
            await commit(fx)
        except StoreError as exc:
            log.error("idle GPU marks not stored", error=str(exc))


async def _chain(
    first: agent_pb2.AgentMessage, rest: AsyncIterator[agent_pb2.AgentMessage]
) -> AsyncIterator[agent_pb2.AgentMessage]:
    yield first
    async for msg in rest:
        yield msg
