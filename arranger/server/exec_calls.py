"""exec_calls: ExecPod, a command run in a running pod and streamed over the API.

Only the job's owner or an admin may, and never with a job token (a job's code must not reach
a shell in its other pods, nor its owner's other jobs, through its token). The pod must be
Running and not being stopped; the command is bounded (see exec_relay.command_problem). Each
use is an event of the job (kind Exec) naming who ran what, stored before the agent is told;
its arguments are hidden from other users as a spec's are (`exec_relay.public_exec_event`).
The agent runs it with the pod's environment, working directory, cgroups and account, or in
the pod's container, and ends it when the pod ends or the call does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import structlog

from arranger.identity import caller
from arranger.server.calls import Calls, Context
from arranger.server.effects import Effects
from arranger.server.exec_relay import (
    ANSWER_S,
    EXEC,
    MAX_INPUT,
    AgentStream,
    ExecSession,
    command_problem,
    exec_event,
    size_problem,
)
from arranger.states import PodState
from arranger.v1 import agent_pb2, arranger_pb2, job_pb2

log = structlog.get_logger("arranger.server")


class ExecCalls(Calls):
    """ExecCalls: the ExecPod call (see the module)."""

    async def ExecPod(
        self, request_iterator: AsyncIterator[arranger_pb2.ExecRequest], context: Context
    ) -> AsyncIterator[arranger_pb2.ExecReply]:
        requests = aiter(request_iterator)
        first = await anext(requests, None)
        if first is None or first.WhichOneof("body") != "start":
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "start: the first request must say what to run"
            )
            return
        start, who = first.start, caller()
        if who.job:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                "exec: a job token may not run commands in pods; use its owner's token",
            )
        job = await self._job(start.job, context)
        await self._may_change(job, "exec in", context)
        problem = command_problem(start.command) or size_problem(
            "start.size", start.size.rows, start.size.cols
        )
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        pod = await self._pod(job, start.pod, context)
        if pod.state != PodState.RUNNING or pod.stopping:
            state = "being stopped" if pod.stopping else pod.state.value
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"pod {pod.name} is {state}: a command runs only in a Running pod",
            )
        link = self.links.get(pod.node)
        if link is None:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"node {pod.node} is not connected; try again later"
            )
            return
        session = self.execs.open(pod.node, who.user)
        if isinstance(session, str):
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, session)
            return
        try:
            fx = Effects()
            fx.event(
                self.clock(), EXEC, exec_event(who.user, start.command, pod.name), job, pod.name
            )
            await self._commit(context, fx)
            log.info("exec", user=who.user, job=job.id, pod=pod.name, node=pod.node)
            order = agent_pb2.ExecOrder(
                exec_id=session.exec_id,
                pod_uid=pod.uid,
                attempt=pod.attempt,
                command=start.command,
                tty=start.tty,
                stdin=start.stdin,
                size=start.size,
            )
            link.send(agent_pb2.ServerMessage(exec=order))
            try:
                agent = await asyncio.wait_for(asyncio.shield(session.agent), ANSWER_S)
            except TimeoutError:
                yield _ended(
                    f"the agent of node {pod.node} did not answer within {ANSWER_S:g} s (an "
                    "agent of a release before exec, or one that lost the server)"
                )
                return
            yield arranger_pb2.ExecReply(
                started=f"pod {pod.name} of job {job.name} on node {pod.node}"
            )
            pump = asyncio.create_task(_forward(requests, session, start.stdin))
            try:
                async for reply in _output(agent):
                    yield reply
                    if reply.HasField("ended"):
                        session.ended = True
                        return
                yield _ended(session.refused or f"node {pod.node} ended the command early")
            finally:
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)
        finally:
            if not session.ended:  # the caller went (or its input was refused): it ends
                link.send(agent_pb2.ServerMessage(exec_cancel=session.exec_id))
            self.execs.close(session)


async def _forward(
    requests: AsyncIterator[arranger_pb2.ExecRequest], session: ExecSession, stdin: bool
) -> None:
    """_forward copies the user's input (with `stdin`) and terminal sizes to the agent. A
    request that is not one of those (a second start, input over MAX_INPUT, input without
    stdin or after its end) ends the command, the session saying why."""
    closed = not stdin
    if closed:
        await session.to_agent.put(agent_pb2.ExecToAgent(input_closed=True))
    async for request in requests:
        kind = request.WhichOneof("body")
        if kind == "resize" and not size_problem(
            "resize", request.resize.rows, request.resize.cols
        ):
            await session.to_agent.put(agent_pb2.ExecToAgent(resize=request.resize))
        elif kind == "input" and not closed and len(request.input) <= MAX_INPUT:
            await session.to_agent.put(agent_pb2.ExecToAgent(input=request.input))
        elif kind == "input_closed":
            if not closed:
                await session.to_agent.put(agent_pb2.ExecToAgent(input_closed=True))
            closed = True
        else:
            session.refused = (
                f"input: at most {MAX_INPUT} bytes a request, only with stdin, before input_closed"
                if kind == "input"
                else size_problem("resize", request.resize.rows, request.resize.cols)
                if kind == "resize"
                else f"{kind}: only the first request says what to run"
            )
            session.end()
            return


async def _output(agent: AgentStream) -> AsyncIterator[arranger_pb2.ExecReply]:
    """_output: the agent's messages as the user's replies, until its call ends, however it
    ends (the agent gone, or the session ended under it)."""
    with contextlib.suppress(grpc.aio.AioRpcError, grpc.aio.UsageError):
        async for msg in agent:
            kind = msg.WhichOneof("body")
            if kind == "stdout":
                yield arranger_pb2.ExecReply(stdout=msg.stdout)
            elif kind == "stderr":
                yield arranger_pb2.ExecReply(stderr=msg.stderr)
            elif kind == "ended":
                yield arranger_pb2.ExecReply(ended=msg.ended)
                return


def _ended(message: str) -> arranger_pb2.ExecReply:
    return arranger_pb2.ExecReply(ended=job_pb2.ExecEnded(exit_code=-1, message=message))
