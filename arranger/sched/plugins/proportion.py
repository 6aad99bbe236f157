"""proportion: queues share the cluster by weight, each capped by its request and capability.

deserved: start every queue at nothing; repeatedly split what remains of the cluster among the
queues not yet satisfied, in proportion to their weights; cap each at min(request, capability),
where request is what its jobs hold plus what they wait for; a queue that reaches its cap is
satisfied. Stop when nothing remains or every queue is satisfied. Each resource is split the
same way. A queue's share is max over resources of allocated/deserved; the queue furthest below
its deserved share (the smallest share) is served first. Capability is a hard cap: a job that
would take its queue beyond it in any resource is not placed.
"""

from __future__ import annotations

from arranger.sched import reasons
from arranger.sched.framework import Plugin, plugin
from arranger.sched.resources import Res, share
from arranger.sched.session import QueueState
from arranger.sched.snapshot import JobInfo

MAX_ROUNDS = 64


def deserved_shares(total: Res, queues: list[QueueState]) -> dict[str, Res]:
    """deserved_shares runs the water-filling above; queues are visited by name."""
    deserved: dict[str, tuple[float, ...]] = {q.info.name: (0.0, 0.0, 0.0) for q in queues}
    caps = {q.info.name: Res.minimum(q.request, q.info.capability).as_tuple() for q in queues}
    unmet = sorted((q for q in queues if q.info.weight > 0), key=lambda q: q.info.name)
    remaining = [float(v) for v in total.as_tuple()]
    for _ in range(MAX_ROUNDS):
        if not unmet or max(remaining) <= 0:
            break
        weights = sum(q.info.weight for q in unmet)
        still: list[QueueState] = []
        for queue in unmet:
            name = queue.info.name
            fraction = queue.info.weight / weights
            grown = tuple(
                min(d + r * fraction, c)
                for d, r, c in zip(deserved[name], remaining, caps[name], strict=True)
            )
            deserved[name] = grown
            if any(g < c for g, c in zip(grown, caps[name], strict=True)):
                still.append(queue)
        given = [sum(d[i] for d in deserved.values()) for i in range(3)]
        left = [t - g for t, g in zip(total.as_tuple(), given, strict=True)]
        if still == unmet and all(abs(a - b) < 1 for a, b in zip(left, remaining, strict=True)):
            break  # nothing moved: what remains fits no one's cap
        remaining, unmet = left, still
    return {name: Res(*(int(v) for v in d)) for name, d in deserved.items()}


@plugin
class Proportion(Plugin):
    name = "proportion"

    def open(self) -> None:
        session = self.session
        for queue in session.queues.values():
            queue.request = queue.allocated
        for job in session.pending_jobs:
            queue = session.queue_of(job)
            queue.request = queue.request + Res.total(job.pending)
        queues = list(session.queues.values())
        for name, deserved in deserved_shares(session.total, queues).items():
            session.queues[name].deserved = deserved
        session.queue_keys.append(lambda queue: share(queue.allocated, queue.deserved))
        session.admissions.append(self.admit)
        session.on_allocate.append(self.allocated)
        session.preemptable.append(self.may_preempt)
        session.reclaimable.append(self.may_reclaim)
        session.evictable.append(self.may_evict)

    def over(self, job: JobInfo) -> bool:
        queue = self.session.queue_of(job)
        return share(queue.allocated, queue.deserved) > 1.0

    def below(self, job: JobInfo) -> bool:
        queue = self.session.queue_of(job)
        return share(queue.allocated, queue.deserved) < 1.0

    def may_preempt(self, job: JobInfo, victim: JobInfo) -> str | None:
        """Preempt within the queue, or from a queue above its deserved share while the
        preemptor's queue is below its own: across queues, preempt takes only what reclaim
        would allow (and only of lower priority), so a queue at or above its share takes
        from no other queue by either action."""
        if victim.queue == job.queue:
            return None
        if not self.over(victim):
            return reasons.VICTIM_QUEUE_NOT_ABOVE_SHARE
        if not self.below(job):
            return reasons.OWN_QUEUE_NOT_BELOW_SHARE
        return None

    def may_reclaim(self, job: JobInfo, victim: JobInfo) -> str | None:
        """Reclaim: a queue below its deserved share takes from queues above theirs."""
        if not self.below(job):
            return reasons.QUEUE_NOT_BELOW_SHARE
        if victim.queue == job.queue:
            return reasons.SAME_QUEUE
        return None if self.over(victim) else reasons.VICTIM_QUEUE_NOT_ABOVE_SHARE

    def may_evict(self, job: JobInfo, victim: JobInfo, request: Res) -> str | None:
        """Taking `request` from another queue (which is above its deserved share, or the
        preempt and reclaim rules would not ask) is allowed when that queue stays at or above
        its deserved share, or when the taking queue, with the job's minimum placed, stays
        within its own. Pods are whole: a queue above its share by less than one pod still
        gives it up to a queue that stays within its share.

        No back and forth: every eviction across queues (preempt or reclaim) needs the taker's
        queue below its deserved share and the victim's above its own, and after one that
        passes this rule either the victim's queue is not below its share (so it takes from no
        other queue) or the taker is not above its share (so no other queue takes from it).
        Taking back needs a share to move by other means first: a job arriving or finishing,
        or the room an eviction frees going to another job than the one it was freed for."""
        if victim.queue == job.queue:
            return None
        theirs = self.session.queue_of(victim)
        if share(theirs.allocated - request, theirs.deserved) >= 1.0:
            return None
        mine = self.session.queue_of(job)
        minimum = Res.total(self.session.minimum(job))
        if share(mine.allocated + minimum, mine.deserved) <= 1.0:
            return None
        return reasons.WOULD_CROSS_SHARES

    def admit(self, job: JobInfo, request: Res) -> str | None:
        queue = self.session.queue_of(job)
        over = (queue.allocated + request).exceeded(queue.info.capability)
        if over:
            return f"queue {queue.info.name} at capability {', '.join(over)}"
        return None

    def allocated(self, job: JobInfo, request: Res, node: int, sign: int) -> None:
        queue = self.session.queue_of(job)
        queue.allocated = queue.allocated + request.scaled(sign)
