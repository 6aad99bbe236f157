"""top: `arranger top [JOB]`, what running jobs use now, refreshed every few seconds.

Without JOB: one line per unfinished job with usage (its pods' latest samples added up)
beside what it requested; with JOB: one line per pod: CPU cores used, resident memory and its
peak against the request, and each GPU's utilisation and memory. `--once` prints one frame and
exits (as `top -b -n 1`); printed to a pipe or a file, frames follow one another (as `top -b`). Figures come from the agents' samples (every usageIntervalSeconds,
5 s by default); a pod not sampled yet shows "-".
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from arranger.client.blocking import Client
from arranger.client.inert import inert, inert_markup
from arranger.client.render import span
from arranger.quantity import format_memory
from arranger.v1 import job_pb2

console = Console(highlight=False, emoji=False, width=None if sys.stdout.isatty() else 200)
UNFINISHED = ["Pending", "Starting", "Running", "Rescheduling"]


def add_top_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", nargs="?", help="one job's pods (default: every unfinished job)")
    p.add_argument("--mine", action="store_true", help="only my jobs")
    p.add_argument("--every", type=float, default=2.0, metavar="S", help="refresh period (2 s)")
    p.add_argument("--once", action="store_true", help="print one frame and exit")


def cmd_top(args: argparse.Namespace) -> int:
    if not 0.2 <= args.every <= 3_600:
        raise ValueError("--every: must be 0.2 to 3600 seconds")
    with Client(args.server, token=args.token, ca=args.ca) as client:

        def frame() -> Group:
            if args.job:
                return job_frame(client.get(args.job))
            return jobs_frame(client.jobs(stages=UNFINISHED, mine=args.mine))

        if args.once:
            console.print(frame())
            return 0
        if not console.is_terminal:  # a pipe or a file: one frame after another, as top -b
            while True:
                console.print(frame())
                console.file.flush()
                time.sleep(args.every)
        from rich.live import Live  # noqa: PLC0415 (only where a terminal is redrawn)

        with Live(frame(), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(args.every)
                live.update(frame(), refresh=True)


def jobs_frame(jobs: Iterable[job_pb2.JobSummary]) -> Group:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("JOB", "OWNER", "STAGE", "PODS", "CPU", "MEMORY", "GPU", "GPU MEMORY"):
        table.add_column(
            column, justify="right" if column not in ("JOB", "OWNER", "STAGE") else "left"
        )
    shown = 0
    for job in jobs:
        usage, asked = job.usage, job.requested
        sampled = job.HasField("usage")
        table.add_row(
            inert_markup(job.name),
            inert_markup(job.owner),
            inert_markup(job.progress.stage),
            str(job.pods),
            _of(f"{usage.cpu_cores:.2f}", f"{asked.cpu:g}", sampled),
            _of(format_memory(usage.memory_bytes), format_memory(asked.memory), sampled),
            (_gpu_utilization(usage.gpus) + _idle(job.idle_gpu_pods)) if asked.gpu else "",
            format_memory(sum(g.memory_bytes for g in usage.gpus)) if usage.gpus else "",
        )
        shown += 1
    note = Text(
        f"unfinished jobs: {shown} · used / requested · {time.strftime('%H:%M:%S')}", style="dim"
    )
    return Group(table, note)


def job_frame(job: job_pb2.TYJob) -> Group:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("POD", "NODE", "STATE", "CPU", "MEMORY", "PEAK", "GPUS"):
        table.add_column(column, justify="right" if column in ("CPU", "MEMORY", "PEAK") else "left")
    templates = {
        "": job.spec.leader.template,
        **{ws.name: ws.template for ws in job.spec.worker_sets},
    }
    for pod in [job.status.leader, *job.status.workers]:
        asked = templates.get(pod.worker_set, job.spec.leader.template).resources
        usage, sampled = pod.usage, pod.HasField("usage")
        gpus = "  ".join(
            f"{g.index}: {_percent(g.utilization)}{'*' if g.whole_gpu else ''} "
            f"{format_memory(g.memory_bytes)}"
            for g in usage.gpus
        )
        if pod.HasField("gpu_idle_since"):
            gpus += f"  idle {span(time.time() - pod.gpu_idle_since.ToSeconds())}"
        table.add_row(
            inert_markup(pod.name),
            inert_markup(pod.node or "-"),
            inert_markup(pod.state),
            _of(f"{usage.cpu_cores:.2f}", f"{asked.cpu:g}", sampled),
            _of(format_memory(usage.memory_bytes), format_memory(asked.memory), sampled),
            format_memory(usage.memory_peak_bytes) if sampled else "-",
            gpus,
        )
    note = Text(
        f"{inert(job.metadata.name)}: {inert(job.status.stage)} · used / requested · GPU n: utilisation "
        f"(* the whole GPU's, shared) and memory · {time.strftime('%H:%M:%S')}",
        style="dim",
    )
    return Group(table, note)


def _idle(pods: int) -> str:
    """_idle: the mark of a job with pods whose GPUs are idle (see idleGpuMinutes)."""
    return f" idle({pods})" if pods else ""


def _of(used: str, asked: str, sampled: bool) -> str:
    return f"{used} / {asked}" if sampled else f"- / {asked}"


def _percent(utilization: float) -> str:
    return "?" if utilization < 0 else f"{utilization:.0f}%"


def _gpu_utilization(gpus: Iterable[job_pb2.GpuUsage]) -> str:
    known = [g.utilization for g in gpus if g.utilization >= 0]
    return f"{sum(known) / len(known):.0f}%" if known else "-"
