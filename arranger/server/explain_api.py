"""explain_api answers ExplainJob: what the next cycle would decide for one job, and why.

Each explanation is a whole scheduling cycle over the kept snapshot: it runs off the event loop
(other calls are answered meanwhile), one at a time, on the snapshot as it is when its turn
comes, and its turn is held until its thread ends, even when its caller gives up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from arranger.sched import SchedulerConfig
from arranger.sched.explain import Explanation, explain
from arranger.server.convert import resources_to_proto
from arranger.server.snapshot import SchedulingState
from arranger.v1 import arranger_pb2


class Explainer:
    """Explainer computes explanations (see the module) from the server's kept `state`."""

    def __init__(
        self, state: SchedulingState, config: SchedulerConfig, clock: Callable[[], float]
    ) -> None:
        self._state, self._config, self._clock = state, config, clock
        self._turn = asyncio.Lock()

    async def explain(self, job_id: str) -> Explanation | None:
        """explain: the job's explanation; None when there is nothing to place or hold."""
        async with self._turn:
            snapshot = self._state.snapshot(self._clock())
            work = asyncio.ensure_future(asyncio.to_thread(explain, snapshot, self._config, job_id))
            try:
                return await asyncio.shield(work)
            except asyncio.CancelledError:  # the caller gave up: the next waits for the thread
                await asyncio.wait([work])
                raise


def explanation_reply(
    found: Explanation,
    reply: arranger_pb2.ExplainJobResponse,
    queue: arranger_pb2.Queue | None,
) -> None:
    """explanation_reply fills `reply` from `found`; `queue` is the job's queue as listed."""
    reply.decision, reply.message = found.decision, found.message
    reply.would_be_placed = found.placed
    reply.queue_position, reply.queue_waiting = found.position, found.waiting_in_queue
    reply.ahead.extend(found.ahead)
    reply.ahead_more = found.ahead_more
    if queue is not None:
        reply.queue.CopyFrom(queue)
        resources_to_proto(found.queue_deserved, reply.queue.status.deserved)
    for fit in found.fits:
        reply.fits.add(
            pod=fit.pod,
            count=fit.count,
            fitting_nodes=fit.fitting_nodes,
            total_nodes=fit.total_nodes,
            rejected=[arranger_pb2.NodeCount(reason=r, nodes=n) for r, n in fit.reasons],
        )
    reply.reservation = found.reservation
    for victim in found.preemptable:
        reply.could_preempt.add(job=victim.job, pods=victim.pods, why=victim.why)
    for refusal in found.refused:
        reply.preemption_refused.add(
            action=refusal.action, reason=refusal.reason, message=refusal.message
        )
    if found.estimated_start is not None:
        reply.estimated_start.FromNanoseconds(int(found.estimated_start * 1e9))
