"""lifecycle_cost: what the clock's bookkeeping of one large job costs the controller.

A real controller, one node per 100 pods, and one job of a learner and W workers, every pod
placed and running. Measured, in CPU microseconds per call (median of the rounds): `timer`
(when the clock next changes the job, asked after every change to it), `tick` (what the
clock changes, run when that time comes), and, where the tree has them (0.4 on), `progress`
(a pod's report of progress, each ReportValues naming its pod) with `progressTimeoutSeconds`
set on every role, and an auxiliary set. Runs on whatever `arranger` it imports, so the same
script measures two trees side by side (PYTHONPATH).

    python bench/lifecycle_cost.py [--workers 9999] [--rounds 15] [--watched]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

from arranger import logsetup
from arranger.client.specfile import load_job_yaml
from arranger.sched import JobDecision, Placement, Plan
from arranger.server.controller import Controller
from arranger.server.convert import spec_to_json
from arranger.server.nodes import NodeRegistration, PodReport
from arranger.server.validation import parse_job
from arranger.states import PodState, ScheduleState

GI = 2**30
SPEC = """
metadata: {{name: big}}
spec:
  minWorkersNum: 1
  leader: {{name: learner, {watch} template: {{command: [l], resources: {{cpu: 10m, memory: 1Mi}}}}}}
  workerSets:
  - {{name: actors, counts: {workers}, {watch} template: {{command: [a], resources: {{cpu: 10m, memory: 1Mi}}}}}}
"""


def build(workers: int, watched: bool) -> tuple[Controller, str]:
    c = Controller()
    nodes = max(1, (workers + 1) // 100 + 1)
    for i in range(nodes):
        c.node_registered(
            NodeRegistration(f"n{i}", f"10.0.{i // 250}.{i % 250}", 64_000, 64 * GI), 0
        )
    watch = "progressTimeoutSeconds: 600," if watched else ""
    spec = parse_job(load_job_yaml(SPEC.format(workers=workers, watch=watch)))
    job, _ = c.submit("j", spec, spec_to_json(spec), 0)
    names = list(job.pods)
    placements = [Placement("j", name, f"n{i // 100}") for i, name in enumerate(names)]
    c.apply_plan(Plan(placements, {"j": JobDecision("j", ScheduleState.SCHEDULED_SUCCEED)}), 0)
    by_node: dict[str, list[PodReport]] = {}
    for name in names:
        pod = job.pods[name]
        by_node.setdefault(pod.node, []).append(
            PodReport(pod.uid, 0, PodState.RUNNING, pid=1, ports={"rpc": 7000})
        )
    leader = job.pods[names[0]]
    c.pod_reports(leader.node, [r for r in by_node[leader.node] if r.pod_uid == leader.uid], 1)
    for node, reports in by_node.items():
        c.pod_reports(node, reports, 1)
    return c, job.id


def per_call_us(call, rounds: int, calls: int = 20) -> float:  # type: ignore[no-untyped-def]
    samples = []
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(calls):
            call()
        samples.append((time.process_time() - start) / calls * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=9_999)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--watched", action="store_true", help="progressTimeoutSeconds on")
    args = parser.parse_args()
    logsetup.configure("warning")  # a transition a pod, at debug level, would be measured too
    c, job_id = build(args.workers, args.watched)
    job = c.jobs[job_id]
    out: dict[str, object] = {
        "workers": args.workers,
        "watched": args.watched,
        "python": platform.python_version(),
        "timer_us": round(per_call_us(lambda: c.timer(job_id), args.rounds), 1),
        "tick_us": round(per_call_us(lambda: c.tick(2.0, [job]), args.rounds), 1),
    }
    if hasattr(c, "progress"):
        pods = list(job.pods)
        out["progress_us"] = round(
            per_call_us(lambda: c.progress(job, pods[7], 3.0), args.rounds, 1000), 2
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
