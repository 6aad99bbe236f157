"""gpupreference: a bonus (1 by default) for nodes that have the pod's preferredGpuType."""

from __future__ import annotations

import numpy as np

from arranger.sched.framework import Plugin, plugin
from arranger.sched.nodes import FloatArray, Index
from arranger.sched.snapshot import JobInfo, PodRequest


@plugin
class GpuPreference(Plugin):
    name = "gpupreference"

    def open(self) -> None:
        nodes, bonus = self.session.nodes, self.session.config.preferred_gpu_bonus
        cache: dict[str, FloatArray] = {}

        def term(pod: PodRequest, job: JobInfo, at: Index) -> FloatArray:
            if not pod.preferred_gpu_type:
                return 0.0  # type: ignore[return-value]  # adds nothing, whatever the shape
            found = cache.get(pod.preferred_gpu_type)
            if found is None:
                found = np.array(
                    [bonus * (pod.preferred_gpu_type in m) for m in nodes.model_sets],
                    dtype=np.float64,
                )
                cache[pod.preferred_gpu_type] = found
            part: FloatArray = found[at]
            return part

        self.session.score_terms.append(term)
