"""scoring ranks feasible nodes for a pod; higher is better, ties go to the first node by name.

BinPack: score = sum_r w_r * u_r / sum_r w_r over the resources r the pod requests, where
u_r = (used_r + request_r) / allocatable_r after placement. Weights default to cpu 1, memory 1,
gpu 3 (SchedulerConfig.weights): filling busy nodes first keeps whole nodes free for gangs.
"""

from __future__ import annotations

import numpy as np

from arranger.sched.session import FloatArray, Session
from arranger.sched.snapshot import PodRequest


def binpack(session: Session, pod: PodRequest) -> FloatArray:
    weights = session.config.weights
    total = np.zeros(len(session), dtype=np.float64)
    weight_sum = 0.0
    for request, used, alloc, weight in (
        (pod.cpu_milli, session.used_cpu, session.alloc_cpu, weights.cpu),
        (pod.memory_bytes, session.used_mem, session.alloc_mem, weights.memory),
        (pod.gpu_milli, session.used_gpu, session.alloc_gpu, weights.gpu),
    ):
        if request > 0 and weight > 0:
            total += weight * (used + request) / np.maximum(alloc, 1)
            weight_sum += weight
    return total / weight_sum if weight_sum else total
