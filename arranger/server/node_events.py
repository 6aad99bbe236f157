"""node_events: what agents tell the controller, and what operators do to nodes.

A mixin of Controller (it uses the controller's records and job steps); kept apart so each
file holds one concern: this one nodes, controller.py jobs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from arranger.server.effects import Effects, KillOrder
from arranger.server.model import SCHEDULER, JobRecord, NodeRecord, PodRecord
from arranger.server.nodes import NodeRegistration, PodReport
from arranger.states import NodeState, PodState, Role

if TYPE_CHECKING:
    from arranger.server.controller import ControllerConfig


class NodeEvents:
    """NodeEvents: registration, resync, heartbeats, timeouts, pod reports, cordon and drain."""

    if TYPE_CHECKING:  # provided by Controller
        config: ControllerConfig
        node_timeout_s: float
        jobs: dict[str, JobRecord]
        nodes: dict[str, NodeRecord]

        def pod_by_uid(self, uid: str) -> tuple[JobRecord, PodRecord] | None: ...
        def jobs_on(self, node: str) -> list[JobRecord]: ...
        def _reconcile(self, job: JobRecord, now: float, fx: Effects) -> None: ...
        def _leader_running(
            self, job: JobRecord, leader: PodRecord, now: float, fx: Effects
        ) -> None: ...
        def _unplace(self, pod: PodRecord) -> None: ...
        def _kill(self, pod: PodRecord, reason: str, remove_scratch: bool, fx: Effects) -> None: ...
        def _pod_ended(
            self, job: JobRecord, pod: PodRecord, state: PodState, exit_code: int | None,
            reason: str, now: float, fx: Effects,
        ) -> None: ...  # fmt: skip
        def _event(
            self, fx: Effects, now: float, kind: str, message: str,
            job: JobRecord | None = None, pod: str = "",
        ) -> None: ...  # fmt: skip

    def node_registered(self, reg: NodeRegistration, now: float) -> Effects:
        """node_registered (re)admits a node and reconciles what it runs with what we think."""
        fx = Effects(schedule=True)
        node = self.nodes.get(reg.name)
        if node is None:
            node = NodeRecord(reg.name, reg.address, reg.cpu_milli, reg.memory_bytes)
            self.nodes[reg.name] = node
        was_ready = node.state == NodeState.READY
        node.address, node.cpu_milli, node.memory_bytes = (
            reg.address,
            reg.cpu_milli,
            reg.memory_bytes,
        )
        node.gpus, node.labels = list(reg.gpus), dict(reg.labels)
        node.agent_version, node.runtimes = reg.agent_version, list(reg.runtimes)
        node.state, node.connected, node.last_seen = NodeState.READY, True, now
        fx.nodes.add(node.name)
        if not was_ready:
            self._event(fx, now, "NodeReady", f"node {node.name} joined at {node.address}")
        fx.merge(self._reconcile_node(node, list(reg.pods), now))
        return fx

    def node_resync(self, name: str, reports: list[PodReport], now: float) -> Effects:
        """node_resync compares an agent's full list of pods with ours (see _reconcile_node)."""
        node = self.nodes.get(name)
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
        for job in self.jobs_on(node.name):
            for pod in job.pods.values():
                if pod.node != node.name or not pod.state.holds_resources:
                    continue
                touched[job.id] = job
                report = reported.get(pod.uid)
                if report is not None and report.attempt == pod.attempt:
                    if pod.stopping and not report.state.terminal:
                        grace = self.config.kill_grace_s
                        fx.kills.append(KillOrder(node.name, pod.uid, pod.attempt, grace, "Resent"))
                    continue
                if pod.state == PodState.LAUNCHING and not (pod.done or pod.stopping):
                    pod.state = PodState.PLACED  # the order never arrived: send it again
                    pod.held_since = None  # no process held the node
                    fx.pods.add(pod.uid)
                elif pod.state == PodState.LAUNCHING:
                    self._pod_ended(job, pod, PodState.KILLED, None, "NeverStarted", now, fx)
                elif pod.state == PodState.RUNNING:
                    self._pod_ended(job, pod, PodState.LOST, None, "AgentLostIt", now, fx)
        fx.merge(self.pod_reports(node.name, reports, now))
        for job in touched.values():
            self._reconcile(job, now, fx)
        return fx

    def node_disconnected(self, name: str, now: float) -> Effects:
        """node_disconnected: the node takes no new pods; its pods keep running until
        nodeTimeout after its agent was last heard from (a dropped connection is no message:
        it does not restart the count)."""
        fx = Effects()
        node = self.nodes.get(name)
        if node is not None and node.connected:
            node.connected = False
            fx.nodes.add(name)
        return fx

    def seen(self, name: str, now: float) -> None:
        """seen: the node's agent was heard from (any message counts)."""
        node = self.nodes.get(name)
        if node is not None:
            node.last_seen = max(node.last_seen, now)

    def heartbeat(self, name: str, cpu_percent: float, memory_used: int, now: float) -> None:
        node = self.nodes.get(name)
        if node is not None:
            node.last_seen, node.cpu_percent, node.memory_used_bytes = now, cpu_percent, memory_used

    def check_nodes(self, now: float) -> Effects:
        """check_nodes makes nodes silent for the node timeout NotReady; their pods become
        Lost."""
        fx = Effects()
        for node in self.nodes.values():
            if node.state != NodeState.READY or now - node.last_seen < self.node_timeout_s:
                continue
            node.state, node.connected = NodeState.NOT_READY, False
            fx.nodes.add(node.name)
            fx.disconnect.add(node.name)  # a late agent must register again, and so be reconciled
            fx.schedule = True
            silent = now - node.last_seen
            self._event(fx, now, "NodeLost", f"node {node.name} silent for {silent:.0f}s")
            if not self.config.replace_lost_pods:
                continue  # no fencing: its pods may still run, so they stay where they are
            for job in self.jobs_on(node.name):
                lost = [
                    p for p in job.pods.values() if p.node == node.name and p.state.holds_resources
                ]
                # Workers first: a lost leader then requeues only the workers still running.
                for pod in reversed(lost):
                    if pod.state == PodState.PLACED:
                        self._unplace(pod)
                        fx.pods.add(pod.uid)
                    else:
                        self._pod_ended(job, pod, PodState.LOST, None, "NodeLost", now, fx)
                if lost:
                    self._reconcile(job, now, fx)
        return fx

    def pod_reports(self, node_name: str, reports: list[PodReport], now: float) -> Effects:
        """pod_reports applies what an agent says about its pods. Reports of attempts we no
        longer want are answered with a kill (still running) or a forget (ended)."""
        fx = Effects()
        touched: dict[str, JobRecord] = {}
        for report in reports:
            found = self.pod_by_uid(report.pod_uid)
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
                pod.state, pod.start_time = PodState.RUNNING, report.start_time or now
                if pod.role == Role.LEADER:
                    self._leader_running(job, pod, now, fx)
            elif report.state.terminal:
                fx.forgets.append((node_name, report.pod_uid))
                self._pod_ended(job, pod, report.state, report.exit_code, report.reason, now, fx)
        for job in touched.values():
            self._reconcile(job, now, fx)
        return fx

    # Operators.

    def cordon(self, name: str, cordoned: bool, now: float) -> Effects:
        """cordon stops (or resumes) placing new pods on the node; its pods keep running."""
        fx = Effects(schedule=True)
        node = self.nodes[name]
        if node.cordoned != cordoned:
            node.cordoned = cordoned
            fx.nodes.add(name)
            self._event(fx, now, "NodeCordoned" if cordoned else "NodeUncordoned", f"node {name}")
        return fx

    def drain(self, name: str, now: float) -> Effects:
        """drain cordons the node and stops its pods, which are placed elsewhere without counting
        a restart (a leader that moves sends its job to Rescheduling)."""
        fx = self.cordon(name, True, now)
        self._event(fx, now, "NodeDrained", f"node {name}: its pods move elsewhere")
        for job in self.jobs_on(name):
            pods = [p for p in job.pods.values() if p.node == name and p.state.holds_resources]
            for pod in reversed(pods):  # workers first, as when a node is lost
                if pod.state == PodState.PLACED:
                    self._unplace(pod)
                    fx.pods.add(pod.uid)
                elif not pod.stopping and not pod.done:
                    pod.requeue = SCHEDULER
                    self._kill(pod, "Drained", False, fx)
            if pods:
                self._reconcile(job, now, fx)
        return fx
