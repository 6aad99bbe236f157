"""idle_gpus: pods that hold GPUs and do not use them (a lab's wish: find GPUs held but idle).

From the per-pod NVML readings the agents already send (usage): a pod whose every GPU it holds
reads a utilisation under `threshold` percent (the server's idleGpuUtilization, 5) for
`idle_s` (idleGpuMinutes; 0, the default: not watched) is marked idle: `pod.gpu_idle_since`
(shown by `top`, `list`, `get` and the dashboard's GPU map) and an event GpuIdle naming it. A
reading at or above the threshold clears the mark (event GpuBusy); an unknown reading (-1),
or none for longer than MAX_GAP_S, starts the idle time again (time not seen is not counted
idle). Only a node's own pods are judged by its readings. A job in a queue with `idleGpuStopMinutes` is stopped once a pod's GPUs stay
idle that much longer (event IdleGpuStop, saying why to its owner; the job ends Stopped).
Readings and marks are in memory only: a restarted server watches afresh. Pure: the caller
carries the Effects out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from arranger.server.effects import Effects
from arranger.server.model import JobRecord, PodRecord
from arranger.server.queues import QueueRecord
from arranger.server.usage import MAX_GAP_S, Sample, UsageBook
from arranger.server.view import ClusterView

IDLE_STOP = "IdleGpuStop"  # the reason of a job stopped for idle GPUs


@dataclass
class IdleWatch:
    """IdleWatch: what the module says, keeping since when each live pod attempt's GPUs read
    idle in the usage book (`book.idle_since`, let go with the pod's samples)."""

    book: UsageBook = field(default_factory=UsageBook)
    idle_s: float = 0.0  # 0: not watched
    threshold: float = 5.0  # percent

    def observe(
        self,
        node: str,
        samples: Iterable[tuple[str, Sample]],
        view: ClusterView,
        queues: Callable[[str], QueueRecord | None],
        stop: Callable[[JobRecord, float, str], Effects],
        now: float,
    ) -> Effects:
        """observe takes `node`'s readings in (of the pods that run there: an agent speaks for
        its own node only): marks, clears and stops as the module says."""
        fx = Effects()
        if self.idle_s <= 0:
            return fx
        for uid, sample in samples:
            found = view.pod(uid)
            if found is None or not sample.gpus:
                continue
            job, pod = found
            if pod.node != node or not pod.live or pod.attempt != sample.attempt or not job.active:
                continue
            known = [g.utilization for g in sample.gpus if g.utilization >= 0]
            if len(known) < len(sample.gpus):
                # A reading it cannot judge: the time until the next known one is not seen
                # idle, so the idle time starts again (a mark stays until a busy reading).
                self.book.idle_since.pop(uid, None)
                continue
            if max(known) >= self.threshold:
                self._busy(job, pod, uid, now, fx)
                continue
            attempt, began, last = self.book.idle_since.get(
                uid, (sample.attempt, sample.time, sample.time)
            )
            if attempt != sample.attempt or sample.time - last > MAX_GAP_S:
                began = sample.time  # a new attempt, or readings missing: start again
            self.book.idle_since[uid] = (sample.attempt, began, sample.time)
            idle_for = now - began
            if idle_for >= self.idle_s and pod.gpu_idle_since is None:
                pod.gpu_idle_since = began
                fx.jobs.add(job.id)
                fx.event(now, "GpuIdle", _idle_text(pod, idle_for, self.threshold), job, pod.name)
            queue = queues(job.spec.queue)
            if queue is None or queue.idle_gpu_stop_s <= 0 or job.terminating:
                continue
            if idle_for >= self.idle_s + queue.idle_gpu_stop_s:
                why = (
                    f"{_idle_text(pod, idle_for, self.threshold)}; queue {queue.name!r} stops "
                    f"such jobs {queue.idle_gpu_stop_s / 60:g} min after they are found idle "
                    "(idleGpuStopMinutes)"
                )
                fx.event(now, IDLE_STOP, why, job, pod.name)
                fx.merge(stop(job, now, why))
        return fx

    def _busy(self, job: JobRecord, pod: PodRecord, uid: str, now: float, fx: Effects) -> None:
        self.book.idle_since.pop(uid, None)
        if pod.gpu_idle_since is not None:
            pod.gpu_idle_since = None
            fx.jobs.add(job.id)
            fx.event(now, "GpuBusy", f"{pod.name} uses its GPUs again", job, pod.name)


def _idle_text(pod: PodRecord, idle_for: float, threshold: float) -> str:
    gpus = ", ".join(str(share.index) for share in pod.gpus) or "?"
    return (
        f"{pod.name} holds GPU {gpus} on {pod.node} unused: under {threshold:g}% for "
        f"{idle_for / 60:.0f} min"
    )
