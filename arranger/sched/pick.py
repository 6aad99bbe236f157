"""pick chooses a node for one pod: filter, score, take the best, check GPUs exactly."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from arranger.sched.plan import GpuShare
from arranger.sched.session import FloatArray, Session
from arranger.sched.snapshot import PodRequest

Scorer = Callable[[Session, PodRequest], FloatArray]


def pick(
    session: Session, pod: PodRequest, score: Scorer
) -> tuple[int, tuple[GpuShare, ...]] | None:
    """pick returns the best node and its GPUs for the pod, or None when no node fits.

    The vectorised filter counts a node's free GPUs of any model; on a node with mixed models
    the exact assignment may still fail, and the next best node is tried.
    """
    mask = session.fit_mask(pod)
    candidates = int(mask.sum())
    if candidates == 0:
        return None
    scores = np.where(mask, score(session, pod), -np.inf)
    for _ in range(candidates):
        node = int(np.argmax(scores))
        gpus = session.assign_gpus(node, pod)
        if gpus is not None:
            return node, gpus
        scores[node] = -np.inf
    return None
