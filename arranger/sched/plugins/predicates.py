"""predicates: the node filters that depend on a pod's shape, not on what nodes hold.

In order: ready and not cordoned; nodeSelector; a container runtime for pods that name an
image; gpuType (hard); a share of a GPU only where shares are held (enforcedSharesOnly) or at
least not failing, and a container's share only where shares are promised (an agent that holds
them refuses it); scarce GPU types (a node with a
GPU model listed in scarceGpuTypes takes only pods that ask for that model); machine groups (a
node labelled with a private group takes only jobs whose queue is granted that group; a job
with machineGroupOnly takes only such nodes); nodes locked by a reservation take only the
starving job's pods. Resource fit is checked by the placement itself.
"""

from __future__ import annotations

import numpy as np

from arranger.sched import reasons
from arranger.sched.framework import NodeFilter, Plugin, plugin
from arranger.sched.nodes import BoolArray
from arranger.sched.snapshot import GPU_MILLI, JobInfo, PodRequest


@plugin
class Predicates(Plugin):
    name = "predicates"

    def open(self) -> None:
        session = self.session
        nodes = session.nodes
        config = session.config
        count = len(nodes)
        everywhere = np.ones(count, dtype=np.bool_)
        # Per node, what the filters below ask of it; computed when first asked.
        scarce: list[frozenset[str]] = []

        def scarce_models() -> list[frozenset[str]]:
            if not scarce:
                scarce.extend(models & config.scarce_gpu_types for models in nodes.model_sets)
            return scarce

        groups: list[tuple[list[str], BoolArray]] = []

        def machine_groups() -> tuple[list[str], BoolArray]:
            """The nodes' private groups ("": none), and which nodes have one."""
            if not groups:
                groups.append(nodes.label_column(config.machine_group_label))
            return groups[0]

        def selector(pod: PodRequest, job: JobInfo) -> BoolArray:
            if not pod.node_selector:
                return everywhere
            wanted = pod.node_selector.items()
            return np.array(
                [all(lab.get(k) == v for k, v in wanted) for lab in nodes.labels], dtype=np.bool_
            )

        # A share of a GPU goes to nodes that enforce shares (enforcedSharesOnly), or to any;
        # never, for now, to one whose enforcement has failed (transient: it comes back).
        enforcing = nodes.shares_enforced | nodes.shares_lost
        holding = ~nodes.shares_lost

        def is_share(pod: PodRequest, job: JobInfo) -> bool:
            return 0 < pod.gpu_milli < GPU_MILLI

        def shares(pod: PodRequest, job: JobInfo) -> BoolArray:
            return enforcing if config.enforced_shares_only and is_share(pod, job) else everywhere

        def shares_held(pod: PodRequest, job: JobInfo) -> BoolArray:
            return holding if is_share(pod, job) else everywhere

        # An agent that holds shares with MPS refuses a container given one (it would run
        # unheld there): such a pod goes only where shares are promised.
        promising = ~enforcing

        def boxed_share(pod: PodRequest, job: JobInfo) -> bool:
            return pod.container and is_share(pod, job)

        def container_shares(pod: PodRequest, job: JobInfo) -> BoolArray:
            return promising if boxed_share(pod, job) else everywhere

        def runtime(pod: PodRequest, job: JobInfo) -> BoolArray:
            return nodes.containers if pod.container else everywhere

        def gpu_type(pod: PodRequest, job: JobInfo) -> BoolArray:
            if not pod.gpu_type:
                return everywhere
            wanted = pod.gpu_models
            return np.array([bool(wanted & models) for models in nodes.model_sets], dtype=np.bool_)

        def scarce_cards(pod: PodRequest, job: JobInfo) -> BoolArray:
            if not config.scarce_gpu_types:
                return everywhere
            return np.array(
                [not s or bool(s & pod.gpu_models) for s in scarce_models()], dtype=np.bool_
            )

        def granted(job: JobInfo) -> frozenset[str]:
            return session.queue_of(job).info.machine_groups

        def machine_group(pod: PodRequest, job: JobInfo) -> BoolArray:
            allowed = granted(job)
            groups, private = machine_groups()
            mask = np.ones(count, dtype=np.bool_)
            for node in np.flatnonzero(private).tolist():
                mask[node] = groups[node] in allowed
            return mask

        def group_only(pod: PodRequest, job: JobInfo) -> BoolArray:
            return machine_groups()[1] if job.machine_group_only else everywhere

        reservation = session.snapshot.reservation
        locked: BoolArray = np.zeros(count, dtype=np.bool_)
        if reservation is not None:
            for name in reservation.nodes:
                if name in nodes.index:
                    locked[nodes.index[name]] = True
        open_nodes: BoolArray = ~locked
        target = reservation.job_id if reservation else ""

        def not_reserved(pod: PodRequest, job: JobInfo) -> BoolArray:
            return everywhere if job.id == target else open_nodes

        session.filters += [
            NodeFilter(
                "ready",
                reasons.NODE_UNSCHEDULABLE,
                lambda p, j: nodes.schedulable,
                lambda p, j: None,
                True,
            ),
            NodeFilter(
                "selector",
                reasons.SELECTOR_MISMATCH,
                selector,
                lambda p, j: tuple(sorted(p.node_selector.items())),
            ),
            NodeFilter("runtime", reasons.NO_CONTAINER_RUNTIME, runtime, lambda p, j: p.container),
            NodeFilter("gputype", reasons.GPU_TYPE_MISMATCH, gpu_type, lambda p, j: p.gpu_type),
            NodeFilter("shares", reasons.SHARES_NOT_ENFORCED, shares, is_share),
            NodeFilter("sharesheld", reasons.SHARES_FAILING, shares_held, is_share, True),
            NodeFilter(
                "containershares", reasons.CONTAINER_SHARE_REFUSED, container_shares, boxed_share
            ),
            NodeFilter("scarce", reasons.SCARCE_GPU, scarce_cards, lambda p, j: p.gpu_type),
            NodeFilter(
                "machinegroup", reasons.MACHINE_GROUP, machine_group, lambda p, j: granted(j)
            ),
            NodeFilter(
                "machinegrouponly",
                reasons.SHARED_NODE,
                group_only,
                lambda p, j: j.machine_group_only,
            ),
            NodeFilter(
                "reserved", reasons.RESERVED, not_reserved, lambda p, j: j.id == target, True
            ),
        ]
