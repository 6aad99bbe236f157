"""Idle GPUs: a pod whose GPUs read under idleGpuUtilization for idleGpuMinutes is marked
(event, summary, message) and unmarked when it uses them again; a queue with
idleGpuStopMinutes stops its job that much later. Pure: a controller, a usage book and the
watch, readings injected with their times."""

from __future__ import annotations

from pathlib import Path

import pytest

from arranger.client.specfile import load_job_yaml
from arranger.sched import GpuShare, JobDecision, Placement, Plan
from arranger.server.config import load_server_config
from arranger.server.controller import Controller, ControllerConfig
from arranger.server.convert import job_progress, job_summary, job_to_proto, spec_to_json
from arranger.server.dashboard_pages import job_row
from arranger.server.effects import Effects
from arranger.server.idle_gpus import IDLE_STOP, IdleWatch
from arranger.server.model import GpuRecord, JobRecord
from arranger.server.nodes import NodeRegistration, PodReport
from arranger.server.queues import QueueRecord
from arranger.server.usage import GpuUse, Sample, UsageBook
from arranger.server.validation import parse_job
from arranger.states import PodState, ScheduleState, Stage

SPEC = """
metadata: {name: rl, queue: QUEUE}
spec:
  leader: {name: learner, template: {command: [l], resources: {gpu: 1}}}
"""
GPUS = tuple(GpuRecord(i, f"GPU-{i}", "H200", 2**37) for i in range(2))


class Lab:
    """Lab: a one-GPU learner running on n1 (GPU 1), watched for idle GPUs after 600 s."""

    def __init__(self, queue: QueueRecord | None = None, idle_s: float = 600.0) -> None:
        self.c = Controller(ControllerConfig())
        self.now = 0.0
        if queue is not None:
            self.c.put_queue(queue, self.now)
        self.c.node_registered(NodeRegistration("n1", "10.0.0.1", 8000, 2**34, gpus=GPUS), self.now)
        spec = parse_job(load_job_yaml(SPEC.replace("QUEUE", queue.name if queue else "default")))
        self.job, _ = self.c.submit("j", spec, spec_to_json(spec), self.now)
        plan = Plan(
            [Placement("j", "rl-learner", "n1", (GpuShare(1, 1000),))],
            {"j": JobDecision("j", ScheduleState.SCHEDULED_SUCCEED)},
        )
        self.c.apply_plan(plan, self.now)
        pod = self.job.leader
        self.c.pod_reports(
            "n1", [PodReport(pod.uid, 0, PodState.RUNNING, pid=5, ports={"rpc": 1})], 0
        )
        self.book = UsageBook()
        self.watch = IdleWatch(self.book, idle_s, threshold=5.0)

    def samples(self, at: float, utilization: float) -> list[tuple[str, Sample]]:
        pod = self.job.leader
        gpu = GpuUse(1, utilization, 2**30, whole_gpu=True)
        return [(pod.uid, Sample(pod.attempt, 0.5, 2**28, 2**28, (gpu,), at))]

    def stop(self, job: JobRecord, now: float, _why: str) -> Effects:
        return self.c.stop(job, now, "arranger (idle GPUs)")

    def read(self, at: float, utilization: float) -> Effects:
        """read: a sample of the learner's GPU at `at`, from n1's agent, taken in."""
        self.now = at
        samples = self.samples(at, utilization)
        self.book.report("n1", samples, self.c.view)
        return self.watch.observe("n1", samples, self.c.view, self.c.queues.get, self.stop, at)

    def idle_until(self, end: float, utilization: float, start: float = 0.0) -> Effects:
        """idle_until: readings every 60 s from `start` to `end`, their effects together."""
        fx = Effects()
        at = start
        while at <= end:
            fx.merge(self.read(at, utilization))
            at += 60.0
        return fx


def kinds(fx: Effects) -> list[str]:
    return [e.kind for e in fx.events]


def test_gpus_idle_for_the_set_time_mark_the_pod_and_use_clears_it() -> None:
    lab = Lab()
    assert not kinds(lab.idle_until(540.0, 2.0))  # every 60 s, as the agents send them
    assert not kinds(lab.read(599.0, 4.9))
    fx = lab.read(600.0, 0.0)
    (idle,) = fx.events
    assert idle.kind == "GpuIdle" and idle.pod == "rl-learner"
    assert idle.message == "rl-learner holds GPU 1 on n1 unused: under 5% for 10 min"
    assert lab.job.leader.gpu_idle_since == 0.0
    assert job_summary(lab.job).idle_gpu_pods == 1
    assert job_progress(lab.job).message.endswith("; GPUs idle: rl-learner")
    assert job_row(lab.job).message.endswith("; GPUs idle: rl-learner")  # the dashboard's
    assert job_to_proto(lab.job).status.leader.gpu_idle_since.seconds == 0
    assert job_to_proto(lab.job).status.leader.HasField("gpu_idle_since")
    assert not kinds(lab.read(630.0, 1.0))  # said once
    assert kinds(lab.read(631.0, 60.0)) == ["GpuBusy"]
    assert lab.job.leader.gpu_idle_since is None and job_summary(lab.job).idle_gpu_pods == 0
    assert not kinds(lab.idle_until(1240.0, 0.0, start=700.0))  # anew from 700: 540 s
    assert kinds(lab.read(1300.0, 0.0)) == ["GpuIdle"]


def test_time_not_seen_is_not_counted_idle_nor_another_nodes_word() -> None:
    """An unknown reading (-1) or a gap in the readings starts the idle time again: two idle
    readings hours apart are not hours idle. A node's readings of a pod that runs on another
    node are not judged (an agent speaks for its own pods)."""
    lab = Lab()
    lab.idle_until(540.0, 0.0)
    assert not kinds(lab.read(560.0, -1.0))  # NVML said nothing
    assert not kinds(lab.idle_until(1140.0, 0.0, start=600.0))  # 540 s idle since it
    lab.read(7200.0, 0.0)  # no reading for hours, then an idle one: from here again
    assert not kinds(lab.read(7700.0, 0.0)) and lab.job.leader.gpu_idle_since is None
    fx = lab.watch.observe(
        "n2", lab.samples(9000.0, 0.0), lab.c.view, lab.c.queues.get, lab.stop, 9000.0
    )
    assert not fx and lab.book.idle_since[lab.job.leader.uid][2] == 7700.0


def test_a_queue_with_idle_gpu_stop_minutes_stops_the_job_and_says_why() -> None:
    lab = Lab(QueueRecord("research", idle_gpu_stop_s=300.0))
    assert kinds(lab.idle_until(600.0, 0.0)) == ["GpuIdle"]
    assert not lab.idle_until(840.0, 0.0, start=660.0).events and not lab.job.terminating
    fx = lab.read(900.0, 0.0)
    stop = next(e for e in fx.events if e.kind == IDLE_STOP)
    assert stop.message == (
        "rl-learner holds GPU 1 on n1 unused: under 5% for 15 min; queue 'research' stops such "
        "jobs 5 min after they are found idle (idleGpuStopMinutes)"
    )
    assert lab.job.terminating and lab.job.stopped_by == "arranger (idle GPUs)"
    assert lab.job.stage == Stage.SUCCEEDED and lab.job.reason == "Stopped"
    assert [k.pod_uid for k in fx.kills] == ["j/rl-learner"]


def test_nothing_is_watched_unless_idle_gpu_minutes_is_set_and_a_new_attempt_starts_afresh() -> (
    None
):
    off = Lab(idle_s=0.0)
    off.read(0.0, 0.0)
    assert not off.read(100_000.0, 0.0) and off.job.leader.gpu_idle_since is None
    lab = Lab()
    assert kinds(lab.idle_until(600.0, 0.0)) == ["GpuIdle"]
    pod = lab.job.leader
    lab.c.pod_reports("n1", [PodReport(pod.uid, 0, PodState.FAILED, exit_code=1)], 601.0)
    assert pod.attempt == 1 and pod.gpu_idle_since is None
    lab.c.tick(700.0)
    lab.c.pod_reports("n1", [PodReport(pod.uid, 1, PodState.RUNNING, pid=6)], 700.0)
    assert not kinds(lab.idle_until(1241.0, 0.0, start=701.0))  # 540 s of the new attempt
    assert kinds(lab.read(1301.0, 0.0)) == ["GpuIdle"]


def test_idle_gpu_settings_are_off_by_default_and_checked(tmp_path: Path) -> None:
    assert load_server_config(None, insecure=True).idle_gpu_s == 0
    path = tmp_path / "server.yaml"
    path.write_text("insecure: true\nidleGpuMinutes: 30\nidleGpuUtilization: 10\n")
    config = load_server_config(path)
    assert (config.idle_gpu_s, config.idle_gpu_utilization) == (1800, 10)
    path.write_text("insecure: true\nidleGpuUtilization: 150\n")
    with pytest.raises(ValueError, match="idleGpuUtilization"):
        load_server_config(path)
