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
        asked = Res.total(queues).as_tuple()  # each queue's request
        # The resources queues compete for: more is asked of them than the cluster has.
        self.contended = [a > t for a, t in zip(asked, session.total.as_tuple(), strict=True)]
        session.queue_keys.append(lambda queue: share(queue.allocated, queue.deserved))
        session.admissions.append(self.admit)
        session.on_allocate.append(self.allocated)
        session.preemptable.append(self.may_preempt)
        session.reclaimable.append(self.may_reclaim)
        session.evictable.append(self.may_evict)
        session.claim_checks.append(self.within_share)

    def lacking(self, job: JobInfo) -> list[int]:
        """lacking: the resources (indexes of Res.as_tuple) the job's minimum asks for in which
        its queue holds less than its deserved share, among those queues compete for (in any
        other, what a queue lacks is free for the taking)."""
        queue = self.session.queue_of(job)
        asked = Res.total(self.session.minimum(job)).as_tuple()
        held, deserved = queue.allocated.as_tuple(), queue.deserved.as_tuple()
        return [i for i in range(3) if asked[i] > 0 and held[i] < deserved[i] and self.contended[i]]

    def over_in(self, victim: JobInfo, resources: list[int]) -> bool:
        """over_in: the victim's queue holds more than its deserved share in one of these."""
        queue = self.session.queue_of(victim)
        held, deserved = queue.allocated.as_tuple(), queue.deserved.as_tuple()
        return any(held[i] > deserved[i] for i in resources)

    def may_preempt(self, job: JobInfo, victim: JobInfo) -> str | None:
        """Preempt within the queue, or from a queue above its deserved share in a resource the
        preemptor's queue lacks (below its own share there, and asked for by the job): across
        queues, preempt takes only what reclaim would allow (and only of lower priority), so a
        queue at or above its share in all the job asks takes from no other queue."""
        if victim.queue == job.queue:
            return None
        lacking = self.lacking(job)
        if not self.over_in(victim, lacking or [0, 1, 2]):
            return reasons.VICTIM_QUEUE_NOT_ABOVE_SHARE
        if not lacking:
            return reasons.OWN_QUEUE_NOT_BELOW_SHARE
        return None

    def may_reclaim(self, job: JobInfo, victim: JobInfo) -> str | None:
        """Reclaim: a queue below its deserved share in a resource the job asks for takes from
        queues above theirs in such a resource. Judged per resource, not on the dominant
        share: a queue at its share in CPU still reclaims the GPUs it deserves and lacks."""
        lacking = self.lacking(job)
        if not lacking:
            return reasons.QUEUE_NOT_BELOW_SHARE
        if victim.queue == job.queue:
            return reasons.SAME_QUEUE
        return None if self.over_in(victim, lacking) else reasons.VICTIM_QUEUE_NOT_ABOVE_SHARE

    def may_evict(self, job: JobInfo, victim: JobInfo, request: Res) -> str | None:
        """Taking `request` from another queue is allowed when, in every resource the request
        holds, that queue stays at or above its deserved share, or the taking queue, with the
        job's minimum placed, stays within its own and (for a contended resource the job asks
        for) the victim's queue was above its share there. Judged resource by resource: a queue above
        its share in memory only is not left below its share of CPU for a job that asks for
        CPU, and a queue that stays above its share in CPU is not left below it in GPUs for a
        queue that then goes above its own. What the job does not ask for stays free for the
        victim's queue to take again. Pods are whole: a queue above its share
        by less than one pod still gives it up to a queue that stays within its share.

        No back and forth: every eviction across queues needs the taker's queue below its
        share in a resource the job asks for and the victim's above its own in one of them;
        after one that passes this rule, in each resource it took, the victim's queue is not
        below its share or the taker's is not above its own, so the victim's queue finds the
        taker's not above its share in what it lacks and cannot take it back. Taking back
        needs a share to move by other means first: a job arriving or finishing, or the room
        an eviction frees going to another job than the one it was freed for."""
        if victim.queue == job.queue:
            return None
        theirs = self.session.queue_of(victim)
        mine = self.session.queue_of(job)
        minimum = Res.total(self.session.minimum(job))
        held = theirs.allocated.as_tuple()
        left = (theirs.allocated - request).as_tuple()
        taken = (mine.allocated + minimum).as_tuple()
        due, own = theirs.deserved.as_tuple(), mine.deserved.as_tuple()
        asked = minimum.as_tuple()
        for i, amount in enumerate(request.as_tuple()):
            if amount <= 0 or left[i] >= due[i]:
                continue
            if taken[i] > own[i] or (asked[i] > 0 and self.contended[i] and held[i] <= due[i]):
                return reasons.WOULD_CROSS_SHARES
        return None

    def within_share(self, job: JobInfo, before: Res | None) -> str | None:
        """Room being freed for another job goes to a job of a queue that, with the job's
        minimum placed (counted in its allocation already), stays within its deserved share
        in every contended resource the minimum asks for. With `before`, the queue's
        allocation before the job evicted its own victims: a queue above its share may still
        replace its own work, but not grow on room freed for others."""
        queue = self.session.queue_of(job)
        asked = Res.total(self.session.minimum(job)).as_tuple()
        held, deserved = queue.allocated.as_tuple(), queue.deserved.as_tuple()
        was = before.as_tuple() if before is not None else (0, 0, 0)
        over = [
            name
            for i, name in enumerate(("cpu", "memory", "gpu"))
            if asked[i] > 0 and self.contended[i] and held[i] > deserved[i] and held[i] > was[i]
        ]
        if over:
            return (
                f"waiting for room being freed for other jobs; with it, queue {queue.info.name}"
                f" would go above its deserved share of {', '.join(over)}"
            )
        return None

    def admit(self, job: JobInfo, request: Res) -> str | None:
        queue = self.session.queue_of(job)
        over = (queue.allocated + request).exceeded(queue.info.capability)
        if over:
            return f"queue {queue.info.name} at capability {', '.join(over)}"
        return None

    def allocated(self, job: JobInfo, request: Res, node: int, sign: int) -> None:
        queue = self.session.queue_of(job)
        queue.allocated = queue.allocated + request.scaled(sign)
