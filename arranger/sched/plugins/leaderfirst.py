"""leaderfirst: the LeaderFirst score (DESIGN §4.3).

The leader scores 1 - sum_r w_r u_r / sum_r w_r over cpu, memory and gpu with the GPU weight
raised (cpu 1, memory 1, gpu 6): the least utilised node, so the learner is not crowded;
workers score sum_r w_r u_r / sum_r w_r with the CPU weight raised (cpu 3, memory 1, gpu 1):
the most utilised node, so actors pack. u_r as in binpack.
"""

from __future__ import annotations

from arranger.sched.framework import Plugin, plugin
from arranger.sched.nodes import FloatArray, Index
from arranger.sched.plugins.binpack import weighted_util
from arranger.sched.snapshot import JobInfo, PodRequest
from arranger.states import BasicPolicy, Role


@plugin
class LeaderFirst(Plugin):
    name = "leaderfirst"

    def open(self) -> None:
        nodes, config = self.session.nodes, self.session.config

        def score(pod: PodRequest, job: JobInfo, at: Index) -> FloatArray:
            if pod.role == Role.LEADER:
                return 1.0 - weighted_util(
                    nodes, pod, at, config.leader_first_leader, requested_only=False
                )
            return weighted_util(nodes, pod, at, config.leader_first_worker, requested_only=False)

        self.session.scorers[BasicPolicy.LEADER_FIRST] = score
