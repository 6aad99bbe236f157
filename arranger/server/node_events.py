"""node_events: what agents tell the controller, and what operators do to nodes.

NodeBook owns the node records and applies these stimuli to them. What they do to jobs and
pods it asks of the controller's job handling through JobSteps, so this file holds nodes and
controller.py jobs, and each can be read without the other.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Protocol

from arranger.sched.snapshot import SHARES_LOST
from arranger.server.effects import Effects, KillOrder
from arranger.server.model import SCHEDULER, JobRecord, NodeRecord, PodRecord
from arranger.server.nodes import NodeRegistration, PodReport
from arranger.server.redaction import public_reason
from arranger.states import NodeState, PodState, Role


class JobSteps(Protocol):
    """JobSteps: the steps of job handling that node events take (the controller's)."""

    def pod_by_uid(self, uid: str) -> tuple[JobRecord, PodRecord] | None:
        """pod_by_uid: the pod with this uid and its job, if in memory."""
        ...

    def jobs_on(self, node: str) -> list[JobRecord]:
        """jobs_on: the jobs that have (or had) a pod placed on the node."""
        ...

    def reconcile(self, job: JobRecord, now: float, fx: Effects) -> None:
        """reconcile looks at the whole job after its pods changed and decides what follows."""
        ...

    def leader_running(self, job: JobRecord, leader: PodRecord, now: float, fx: Effects) -> None:
        """leader_running records where the job's leader now runs (its address)."""
        ...

    def pod_ended(
        self,
        job: JobRecord,
        pod: PodRecord,
        state: PodState,
        exit_code: int | None,
        reason: str,
        now: float,
        fx: Effects,
        ended_at: float | None = None,
    ) -> None:
        """pod_ended records the end of the pod's attempt and prepares what comes next;
        `ended_at`: when it ended, by the server's clock, if known (else `now`)."""
        ...

    def kill(
        self,
        pod: PodRecord,
        reason: str,
        remove_scratch: bool,
        fx: Effects,
        grace_s: float | None = None,
    ) -> None:
        """kill orders the pod's attempt stopped (once: a pod already stopping is left)."""
        ...

    def unplace(self, pod: PodRecord) -> None:
        """unplace sends a pod back to Pending, for the scheduler to place anew."""
        ...


class NodeBook:
    """NodeBook: the node records (`records`, by name), and registration, resync, heartbeats,
    timeouts, pod reports, cordon and drain. `kill_grace_s` is the time between SIGTERM and
    SIGKILL of a kill sent again; without `replace_lost_pods` (no fencing) the pods of a node
    that went silent stay where they are (they may still run)."""

    def __init__(self, steps: JobSteps, kill_grace_s: float, replace_lost_pods: bool) -> None:
        self.steps = steps
        self.kill_grace_s = kill_grace_s
        self.replace_lost_pods = replace_lost_pods
        self.records: dict[str, NodeRecord] = {}

    def restore(self, nodes: list[NodeRecord], now: float) -> None:
        """restore loads stored nodes after a restart: none is connected, and each has a node
        timeout from now to reconnect."""
        for node in nodes:
            node.connected, node.last_seen = False, now
            self.records[node.name] = node

    def forget(self, name: str) -> None:
        """forget drops a node that was never stored (its first registration was not)."""
        self.records.pop(name, None)

    def node_registered(self, reg: NodeRegistration, now: float) -> Effects:
        """node_registered (re)admits a node and reconciles what it runs with what we think."""
        fx = Effects(schedule=True)
        node = self.records.get(reg.name)
        if node is None:
            node = NodeRecord(reg.name, reg.address, reg.cpu_milli, reg.memory_bytes)
            self.records[reg.name] = node
        was_ready = node.state == NodeState.READY
        problems_before = {gpu.index: gpu.problem for gpu in node.gpus}
        node.address, node.cpu_milli, node.memory_bytes = (
            reg.address,
            reg.cpu_milli,
            reg.memory_bytes,
        )
        node.gpus, node.labels = list(reg.gpus), dict(reg.labels)
        node.agent_version, node.runtimes = reg.agent_version, list(reg.runtimes)
        node.gpu_sharing, node.shares_held = reg.gpu_sharing, None  # as it registers now
        node.state, node.connected, node.last_seen = NodeState.READY, True, now
        node.clock_offset = measured_offset(reg.sent_at, now)
        node.agent_id = reg.agent_id or node.agent_id  # an older agent leaves the holder as is
        fx.nodes.add(node.name)
        if not was_ready:
            fx.event(now, "NodeReady", f"node {node.name} joined at {node.address}")
        _gpu_news(node, problems_before, now, fx)
        fx.merge(self._reconcile_node(node, list(reg.pods), now))
        return fx

    def node_resync(self, name: str, reports: list[PodReport], now: float) -> Effects:
        """node_resync compares an agent's full list of pods with ours (see _reconcile_node)."""
        node = self.records.get(name)
        if node is None or node.state != NodeState.READY:
            return Effects()
        return self._reconcile_node(node, reports, now)

    def _reconcile_node(self, node: NodeRecord, reports: list[PodReport], now: float) -> Effects:
        """_reconcile_node: a pod we launched there that the agent does not know never got its
        order (launch it again) or was lost with a restarted agent (Lost); a pod we are stopping
        that still runs gets its kill again; then every report is applied as usual."""
        fx = Effects()
        reported = {r.pod_uid: r for r in reports}
        touched: dict[str, JobRecord] = {}
        for job in self.steps.jobs_on(node.name):
            for pod in job.pods.values():
                if pod.node != node.name or not pod.state.holds_resources:
                    continue
                touched[job.id] = job
                report = reported.get(pod.uid)
                if report is not None and report.attempt == pod.attempt:
                    if pod.stopping and not report.state.terminal:
                        grace = self.kill_grace_s
                        fx.kills.append(KillOrder(node.name, pod.uid, pod.attempt, grace, "Resent"))
                    continue
                if pod.state == PodState.LAUNCHING and not (pod.done or pod.stopping):
                    pod.state = PodState.PLACED  # the order never arrived: send it again
                    pod.held_since = None  # no process held the node
                    fx.pods.add(pod.uid)
                elif pod.state == PodState.LAUNCHING:
                    self.steps.pod_ended(job, pod, PodState.KILLED, None, "NeverStarted", now, fx)
                elif pod.state == PodState.RUNNING:
                    self.steps.pod_ended(job, pod, PodState.LOST, None, "AgentLostIt", now, fx)
        fx.merge(self.pod_reports(node.name, reports, now))
        for job in touched.values():
            self.steps.reconcile(job, now, fx)
        return fx

    def node_disconnected(self, name: str, now: float) -> Effects:
        """node_disconnected: the node takes no new pods; its pods keep running until
        nodeTimeout after its agent was last heard from (a dropped connection is no message:
        it does not restart the count)."""
        fx = Effects()
        node = self.records.get(name)
        if node is not None and node.connected:
            node.connected = False
            fx.nodes.add(name)
        return fx

    def seen(self, name: str, now: float) -> None:
        """seen: the node's agent was heard from (any message counts)."""
        node = self.records.get(name)
        if node is not None:
            node.last_seen = max(node.last_seen, now)

    def heartbeat(
        self,
        name: str,
        cpu_percent: float,
        memory_used: int,
        now: float,
        sent_at: float = 0.0,
        shares_held: bool | None = None,
    ) -> Effects:
        """heartbeat takes a node's live facts; `shares_held` (None: not said) whether its
        agent holds GPU shares to their limits now. A node whose enforcement fails takes no
        new share until it holds again (an event says each change); its pods run on."""
        fx = Effects()
        node = self.records.get(name)
        if node is None:
            return fx
        node.last_seen, node.cpu_percent, node.memory_used_bytes = now, cpu_percent, memory_used
        offset = measured_offset(sent_at, now)
        if offset is not None:
            node.clock_offset = offset
        if shares_held is not None:
            before = node.shares
            node.shares_held = shares_held
            if node.shares != before:
                fx.nodes.add(name)
                fx.schedule = True
                if node.shares == SHARES_LOST:
                    fx.event(
                        now,
                        "GpuSharesUnenforced",
                        f"node {name}: its agent no longer "
                        "holds GPU shares to their limits; no new share goes there until "
                        "it does again (pods running there run on)",
                    )
                elif before == SHARES_LOST:
                    fx.event(
                        now,
                        "GpuSharesEnforced",
                        f"node {name}: GPU shares are held to their limits again",
                    )
        return fx

    def gpu_problems(self, name: str, problems: Mapping[int, str], now: float) -> Effects:
        """gpu_problems takes the node's unhealthy GPUs as its agent says them now (by index,
        and why; every other GPU of the node is healthy). Nothing more is placed on an
        unhealthy GPU, and the pods on it run on; an event says each change, once (the agent
        says the same in every heartbeat)."""
        fx = Effects()
        node = self.records.get(name)
        if node is None:
            return fx
        before = {gpu.index: gpu.problem for gpu in node.gpus}
        for gpu in node.gpus:
            gpu.problem = problems.get(gpu.index, "")
        _gpu_news(node, before, now, fx)
        return fx

    def check_nodes(self, now: float, timeout_s: float) -> Effects:
        """check_nodes makes nodes silent for `timeout_s` (the node timeout) NotReady; their
        pods become Lost."""
        fx = Effects()
        for node in self.records.values():
            if node.state != NodeState.READY or now - node.last_seen < timeout_s:
                continue
            node.state, node.connected = NodeState.NOT_READY, False
            fx.nodes.add(node.name)
            fx.disconnect.add(node.name)  # a late agent must register again, and so be reconciled
            fx.schedule = True
            silent = now - node.last_seen
            fx.event(now, "NodeLost", f"node {node.name} silent for {silent:.0f}s")
            if not self.replace_lost_pods:
                continue  # no fencing: its pods may still run, so they stay where they are
            for job in self.steps.jobs_on(node.name):
                lost = [
                    p for p in job.pods.values() if p.node == node.name and p.state.holds_resources
                ]
                # Workers first: a lost leader then requeues only the workers still running.
                for pod in reversed(lost):
                    if pod.state == PodState.PLACED:
                        self.steps.unplace(pod)
                        fx.pods.add(pod.uid)
                    else:
                        self.steps.pod_ended(job, pod, PodState.LOST, None, "NodeLost", now, fx)
                if lost:
                    self.steps.reconcile(job, now, fx)
        return fx

    def pod_reports(self, node_name: str, reports: list[PodReport], now: float) -> Effects:
        """pod_reports applies what an agent says about its pods. Reports of attempts we no
        longer want are answered with a kill (still running) or a forget (ended)."""
        fx = Effects()
        touched: dict[str, JobRecord] = {}
        node = self.records.get(node_name)
        for report in reports:
            found = self.steps.pod_by_uid(report.pod_uid)
            job, pod = found if found else (None, None)
            current = (
                job is not None
                and pod is not None
                and pod.node == node_name
                and pod.attempt == report.attempt
                and pod.live
            )
            if not current or job is None or pod is None:
                if report.state.terminal:
                    fx.forgets.append((node_name, report.pod_uid))
                else:
                    kill = KillOrder(node_name, report.pod_uid, report.attempt, 0.0, "Unknown")
                    fx.kills.append(kill)
                continue
            touched[job.id] = job
            fx.pods.add(pod.uid)
            pod.pid = report.pid or pod.pid
            if report.ports:
                pod.ports = dict(report.ports)
            if report.state == PodState.RUNNING and pod.state != PodState.RUNNING:
                started = node.server_time(report.start_time, now) if node else None
                pod.state, pod.start_time = PodState.RUNNING, started or now
                if pod.role == Role.LEADER:
                    self.steps.leader_running(job, pod, now, fx)
            elif report.state.terminal:
                fx.forgets.append((node_name, report.pod_uid))
                # An end time is taken only from an agent that says its clock (measured).
                ended = None
                if node is not None and node.clock_offset is not None:
                    ended = node.server_time(report.finish_time, now)
                # Every user reads the reason (job listings, events, history): it holds none
                # of the job's hidden values.
                reason = public_reason(report.reason, job.spec)
                self.steps.pod_ended(
                    job, pod, report.state, report.exit_code, reason, now, fx, ended
                )
        for job in touched.values():
            self.steps.reconcile(job, now, fx)
        return fx

    # Operators.

    def cordon(self, name: str, cordoned: bool, now: float) -> Effects:
        """cordon stops (or resumes) placing new pods on the node; its pods keep running."""
        fx = Effects(schedule=True)
        node = self.records[name]
        if node.cordoned != cordoned:
            node.cordoned = cordoned
            fx.nodes.add(name)
            fx.event(now, "NodeCordoned" if cordoned else "NodeUncordoned", f"node {name}")
        return fx

    def drain(self, name: str, now: float) -> Effects:
        """drain cordons the node and stops its pods, which are placed elsewhere without counting
        a restart (a leader that moves sends its job to Rescheduling)."""
        fx = self.cordon(name, True, now)
        fx.event(now, "NodeDrained", f"node {name}: its pods move elsewhere")
        for job in self.steps.jobs_on(name):
            pods = [p for p in job.pods.values() if p.node == name and p.state.holds_resources]
            for pod in reversed(pods):  # workers first, as when a node is lost
                if pod.state == PodState.PLACED:
                    self.steps.unplace(pod)
                    fx.pods.add(pod.uid)
                elif not pod.stopping and not pod.done:
                    pod.requeue = SCHEDULER
                    self.steps.kill(pod, "Drained", False, fx)
            if pods:
                self.steps.reconcile(job, now, fx)
        return fx


def _gpu_news(node: NodeRecord, before: Mapping[int, str], now: float, fx: Effects) -> None:
    """_gpu_news: an event for each GPU of the node that turned unhealthy (GpuUnhealthy) or
    healthy again (GpuHealthy: its agent restarted) since `before` (problems by index); the
    node is looked at again when any GPU's problem changed."""
    for gpu in node.gpus:
        was = before.get(gpu.index, "")
        if gpu.problem == was:
            continue
        fx.nodes.add(node.name)
        fx.schedule = True
        if gpu.problem and not was:
            fx.event(
                now,
                "GpuUnhealthy",
                f"node {node.name} GPU {gpu.index}: {gpu.problem}; "
                "nothing more is placed on it (pods running on it run on)",
            )
        elif not gpu.problem:
            fx.event(
                now,
                "GpuHealthy",
                f"node {node.name} GPU {gpu.index} takes pods again: its agent finds it healthy",
            )


def measured_offset(sent_at: float, now: float) -> float | None:
    """measured_offset: an agent's clock minus the server's, from the agent's time in a
    message received `now` (None: the agent did not say)."""
    if not sent_at or not math.isfinite(sent_at):
        return None
    return sent_at - now
