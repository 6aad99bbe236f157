"""affinity: JobAffinity packs a job's pods together, JobAntiAffinity spreads them.

With c the number of the job's pods on a node (bound, or placed earlier in this cycle):
JobAffinity scores c / (1 + c) + 0.1 * BinPack (together, then onto busy nodes);
JobAntiAffinity scores 1 / (1 + c) + 0.1 * (1 - BinPack) (apart, then onto empty nodes).
"""

from __future__ import annotations

import numpy as np

from arranger.sched.framework import Plugin, plugin
from arranger.sched.nodes import FloatArray, Index
from arranger.sched.plugins.binpack import weighted_util
from arranger.sched.resources import Res
from arranger.sched.snapshot import JobInfo, PodRequest
from arranger.states import BasicPolicy

TIE_WEIGHT = 0.1
POLICIES = (BasicPolicy.JOB_AFFINITY, BasicPolicy.JOB_ANTI_AFFINITY)


@plugin
class Affinity(Plugin):
    name = "affinity"

    def open(self) -> None:
        session = self.session
        nodes = session.nodes
        counts: dict[str, FloatArray] = {}

        def of(job: JobInfo) -> FloatArray:
            found = counts.get(job.id)
            if found is None:
                found = np.zeros(len(nodes), dtype=np.float64)
                for pod in job.running:
                    if pod.node in nodes.index:
                        found[nodes.index[pod.node]] += 1
                counts[job.id] = found
            return found

        def together(pod: PodRequest, job: JobInfo, at: Index) -> FloatArray:
            c = of(job)[at]
            packed = weighted_util(nodes, pod, at, session.config.binpack, requested_only=True)
            return c / (1.0 + c) + TIE_WEIGHT * packed

        def apart(pod: PodRequest, job: JobInfo, at: Index) -> FloatArray:
            c = of(job)[at]
            packed = weighted_util(nodes, pod, at, session.config.binpack, requested_only=True)
            return 1.0 / (1.0 + c) + TIE_WEIGHT * (1.0 - packed)

        def placed(job: JobInfo, request: Res, node: int, sign: int) -> None:
            if job.basic_policy in POLICIES:
                of(job)[node] += sign

        session.scorers[BasicPolicy.JOB_AFFINITY] = together
        session.scorers[BasicPolicy.JOB_ANTI_AFFINITY] = apart
        session.on_allocate.append(placed)
