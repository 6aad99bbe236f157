"""render prints jobs, nodes and events as rich tables, or as JSON/YAML for scripts."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import yaml
from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table
from rich.text import Text

from arranger.client.inert import inert, inert_markup
from arranger.client.text import (
    STAGE_STYLE,
    age,
    as_dict,
    clock,
    elapsed,
    jobs_lines,
    seconds_of,
    short,
    since,
    write_plain,
)
from arranger.quantity import format_memory
from arranger.v1 import arranger_pb2, job_pb2, node_pb2


def dump(data: Message | Sequence[Message], output: str, console: Console) -> None:
    """dump prints data (a message, or a list of them) as JSON or YAML: highlighted on a
    terminal, as it is for a program."""
    if not console.is_terminal:
        write_plain(data, output, console.file)
        return
    plain: Any = as_dict(data) if isinstance(data, Message) else [as_dict(m) for m in data]
    if output == "json":
        console.print_json(json.dumps(plain))
    else:
        console.print(yaml.safe_dump(plain, sort_keys=False), end="", markup=False, highlight=False)


def stage(value: str) -> str:
    """stage renders a stage or pod state in its colour, as markup (an unknown one inert)."""
    style = STAGE_STYLE.get(value, "")
    return f"[{style}]{value}[/]" if style else inert_markup(value)


def print_jobs(
    jobs: Sequence[job_pb2.JobSummary],
    console: Console,
    experiments: Sequence[job_pb2.ExperimentSummary] = (),
) -> None:
    """print_jobs prints job summaries, and a line for each experiment among them, as aligned
    columns, the stage in colour on a terminal. Not a rich Table: a listing may have 100,000
    rows, and this costs a few microseconds each."""
    lines = jobs_lines(jobs, color=console.is_terminal, experiments=experiments)
    if console.is_terminal:
        for line in lines:
            console.print(line, overflow="ellipsis", no_wrap=True)
    else:
        console.file.write("".join(line + "\n" for line in lines))
        console.file.flush()


def job_detail(job: job_pb2.TYJob, console: Console) -> None:
    """job_detail prints one job: who and what it is, where it stands, when it started and
    finished and how long it ran, then a table of its pods with theirs. Each value but the
    stage's colour is inert."""
    st, meta = job.status, job.metadata
    now = time.time()
    rows: list[tuple[str, str | Text]] = [
        ("Name", f"{meta.name}  (id {meta.id})"),
        ("Owner", meta.owner or "-"),
        ("Queue / priority", f"{meta.queue} / {job.spec.priority}"),
        ("Stage", Text.from_markup(stage(st.stage))),
        ("Outcome", st.outcome or "-"),  # Completed | Failed | Stopped once it ended
        ("Schedule", st.schedule_state),
        ("Reason", f"{st.reason}: {st.message}" if st.message else st.reason),
        ("Leader address", st.leader_address or "-"),
        ("Restarts", _restarts_left(job)),
        *_retries_left(job),
        (
            "Workers",
            f"{st.running_workers} running of {sum(w.counts for w in job.spec.worker_sets)}"
            f" wanted (minWorkersNum {job.spec.min_workers_num})" + _elastic(job.spec),
        ),
        ("Submitted", f"{clock(st.submit_time, now)} ({since(st.submit_time, now)} ago)"),
        ("Started", clock(st.start_time, now)),
        ("Finished", clock(st.finish_time, now)),
        (
            "Elapsed",
            elapsed(st.start_time, st.finish_time, now)
            + (
                ""
                if seconds_of(st.finish_time) is not None or seconds_of(st.start_time) is None
                else " (running)"
            ),
        ),
    ]
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for key, value in rows:
        grid.add_row(key, value if isinstance(value, Text) else Text(inert(value)))
    console.print(grid)
    console.print()
    console.print(pods_table([st.leader, *st.workers], now))


def pods_table(pods: Sequence[job_pb2.PodStatus], now: float | None = None) -> Table:
    """pods_table: one row per pod, with when its current attempt started and finished and
    how long it ran (so far, while it runs)."""
    table = Table(box=None, header_style="bold")
    for column in (
        "POD",
        "ROLE",
        "RANK",
        "NODE",
        "GPUS",
        "STATE",
        "ATTEMPT",
        "EXIT",
        "STARTED",
        "FINISHED",
        "ELAPSED",
        "REASON",
    ):
        table.add_column(column, no_wrap=True)
    for pod in pods:
        gpus = ",".join(f"{g.index}" + ("" if g.share >= 1 else f":{g.share:g}") for g in pod.gpus)
        table.add_row(
            inert_markup(pod.name),
            inert_markup(pod.role),
            "-" if pod.rank < 0 else str(pod.rank),
            inert_markup(pod.node or "-"),
            gpus or "-",
            stage(pod.state),
            str(pod.attempt),
            str(pod.exit_code) if pod.HasField("exit_code") else "-",
            clock(pod.start_time, now),
            clock(pod.finish_time, now),
            elapsed(pod.start_time, pod.finish_time, now),
            inert_markup(_reason(pod, now)),
        )
    return table


def _restarts_left(job: job_pb2.TYJob) -> str:
    """_restarts_left: the restarts the leader and each worker set spent, of restartLimit, and
    what is left: `leader 1 of 3 (2 left), actors 0 of 3 (3 left)`."""
    limit, st = job.spec.restart_limit, job.status
    spent = [("leader", st.leader_restarts)]
    spent += [(ws.name, st.worker_set_restarts.get(ws.name, 0)) for ws in job.spec.worker_sets]
    return ", ".join(f"{who} {n} of {limit} ({max(limit - n, 0)} left)" for who, n in spent)


def _retries_left(job: job_pb2.TYJob) -> list[tuple[str, str]]:
    """_retries_left: a row of the transient retries (retryOnExitCodes, losses with a node)
    spent and left, for the leader and each set that lists codes or spent one (no row where
    none did)."""
    limit, st = job.status.retry_limit, job.status
    roles = [("leader", st.leader_retries, job.spec.leader.retry_on_exit_codes)]
    roles += [
        (ws.name, st.worker_set_retries.get(ws.name, 0), ws.retry_on_exit_codes)
        for ws in job.spec.worker_sets
    ]
    parts = [
        f"{who} {n} of {limit} ({max(limit - n, 0)} left"
        + (f"; exit {'/'.join(map(str, codes))})" if codes else ")")
        for who, n, codes in roles
        if codes or n
    ]
    return [("Retries", ", ".join(parts))] if parts else []


def _elastic(spec: job_pb2.JobSpec) -> str:
    """_elastic: the wanted count and range of each set below its maxCounts ("": none)."""
    sets = [ws for ws in spec.worker_sets if ws.max_counts != ws.counts]
    return "".join(f"; {ws.name} {ws.counts} of {ws.min_count}..{ws.max_counts}" for ws in sets)


def _reason(pod: job_pb2.PodStatus, now: float | None) -> str:
    """_reason: the pod's reason, or how soon it is evicted while under notice."""
    left = seconds_of(pod.evict_at)
    if left is None:
        return short(inert(pod.reason), 40)  # cut as it is shown
    return f"evicted in {max(0.0, left - (now if now is not None else time.time())):.0f} s"


def nodes_table(nodes: Sequence[node_pb2.Node]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in (
        "NAME",
        "STATE",
        "ADDRESS",
        "CPU",
        "MEMORY",
        "GPU",
        "GPU GUARD",
        "PODS",
        "RUNTIMES",
        "LABELS",
    ):
        table.add_column(column, no_wrap=column not in ("LABELS", "RUNTIMES"))
    for node in nodes:
        state = node.state + (",Cordoned" if node.cordoned else "")
        away = node.disconnected_seconds
        if away > 0:
            state += f" (disconnected {span(away)})"
        offset = node.clock_offset_seconds if node.HasField("clock_offset_seconds") else 0.0
        if abs(offset) >= CLOCK_SHOWN_S:  # pod times are corrected; its clock wants fixing
            state += f" (clock {'+' if offset > 0 else '-'}{span(abs(offset))})"
        style = "green" if node.state == "Ready" and not node.cordoned and not away else "red"
        cap, used = node.capacity, node.allocated
        gpu = "-"
        if node.gpus:
            models = sorted({g.model for g in node.gpus})
            fake = " (fake)" if any(g.fake for g in node.gpus) else ""
            sick = sum(1 for g in node.gpus if g.problem)  # an unhealthy GPU takes no pods
            fake += f" ({sick} unhealthy)" if sick else ""
            per_gpu = " ".join(
                f"{g.index}:{g.allocated:g}{'!' if g.problem else ''}" for g in node.gpus
            )
            gpu = f"{used.gpu:g}/{cap.gpu:g} {'/'.join(models)}{fake} [{per_gpu}]"
        table.add_row(
            inert_markup(node.name),
            f"[{style}]{inert_markup(state)}[/]",
            inert_markup(node.address),
            f"{used.cpu:g}/{cap.cpu:g}",
            f"{format_memory(used.memory)}/{format_memory(cap.memory)}",
            inert_markup(gpu),
            gpu_guard(node),
            str(node.pods),
            inert_markup(", ".join(node.runtimes) or "-"),
            inert_markup(",".join(f"{k}={v}" for k, v in sorted(node.labels.items())) or "-"),
        )
    return table


CLOCK_SHOWN_S = 1.0  # a node's clock this far off the server's is shown in the table


def span(seconds: float) -> str:
    """span: a duration as one rounded unit: `45s`, `2m`, `3h`, `2d`."""
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{round(seconds / size)}{unit}"
    return f"{round(seconds)}s"


def gpu_guard(node: node_pb2.Node) -> str:
    """gpu_guard: what holds a node's pods to their GPU grants, in short: `devices` (a pod
    opens its own GPUs' device nodes only), `shares` (a share of a GPU is a limit, not only a
    promise), both as `devices+shares`, or `none`; `-` for a node without GPUs and `?` where its
    agent does not say (an agent older than GpuSharing)."""
    if not node.gpus:
        return "-"
    if not node.HasField("gpu_sharing"):
        return "?"
    said = node.gpu_sharing
    held = [word for word, on in (("devices", said.isolation), ("shares", said.enforced)) if on]
    return "+".join(held) or "none"


def events_table(events: Sequence[arranger_pb2.Event]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("TIME", "JOB", "POD", "KIND", "MESSAGE"):
        table.add_column(column, no_wrap=column != "MESSAGE")
    for event in events:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event.time.seconds))
        table.add_row(
            when,
            inert_markup(event.job or "-"),
            inert_markup(event.pod or "-"),
            inert_markup(event.kind),
            inert_markup(event.message),
        )
    return table


def _amount(res: node_pb2.NodeResources) -> str:
    parts = [f"cpu {res.cpu:g}", f"mem {format_memory(res.memory)}"]
    if res.gpu:
        parts.append(f"gpu {res.gpu:g}")
    return ", ".join(parts)


def _capability(cap: arranger_pb2.Capability) -> str:
    """_capability renders a queue's caps: "cpu 8, mem 16Gi" ("" when there are none)."""
    parts = []
    if cap.HasField("cpu"):
        parts.append(f"cpu {cap.cpu:g}")
    if cap.HasField("memory"):
        parts.append(f"mem {format_memory(cap.memory)}")
    if cap.HasField("gpu"):
        parts.append(f"gpu {cap.gpu:g}")
    return ", ".join(parts)


def queues_table(queues: Sequence[arranger_pb2.Queue]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in (
        "NAME",
        "WEIGHT",
        "CAPABILITY",
        "ALLOCATED",
        "DESERVED",
        "PENDING",
        "RUNNING",
        "GROUPS",
        "POLICY",
    ):
        table.add_column(column, no_wrap=column not in ("CAPABILITY", "GROUPS", "POLICY"))
    for queue in queues:
        st = queue.status
        table.add_row(
            inert_markup(queue.name),
            f"{queue.weight:g}",
            _capability(queue.capability) or "-",
            _amount(st.allocated),
            _amount(st.deserved),
            str(st.pending_jobs),
            str(st.running_jobs),
            inert_markup(",".join(queue.machine_groups) or "-"),
            inert_markup(_policy(queue)),
        )
    return table


def _policy(queue: arranger_pb2.Queue) -> str:
    parts = [f"users {','.join(queue.users)}" if queue.users else "everyone"]
    if queue.HasField("max_priority"):
        parts.append(f"priority <= {queue.max_priority}")
    if queue.allow_non_preemptible:
        parts.append("non-preemptible allowed")
    if queue.min_run_seconds:
        parts.append(f"min run {queue.min_run_seconds:g} s")
    if queue.idle_gpu_stop_minutes:
        parts.append(f"idle GPUs stopped after {queue.idle_gpu_stop_minutes:g} min")
    return "; ".join(parts)


def tokens_table(tokens: Sequence[Any]) -> Table:
    """tokens_table: issued tokens (store.TokenRow), never the tokens themselves."""
    table = Table(box=None, header_style="bold")
    for column in ("NAME", "USER", "ROLE", "CREATED", "LAST USED"):
        table.add_column(column, no_wrap=True)
    for token in tokens:
        used = "never" if token.last_used is None else _clock(token.last_used)
        table.add_row(
            inert_markup(token.name),
            inert_markup(token.user),
            inert_markup(token.role),
            _clock(token.created),
            used,
        )
    return table


def _clock(when: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when))


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def explanation(reply: arranger_pb2.ExplainJobResponse, console: Console) -> None:
    """explanation prints ExplainJob's answer as a short report: a line, then rows of plain
    text, each shown inert."""
    job, st = reply.job, reply.job.status
    meta = job.metadata
    console.print(
        f"[bold]{inert_markup(meta.name)}[/] (queue {inert_markup(meta.queue)}, priority "
        f"{job.spec.priority}): {stage(st.stage)}, "
        + inert_markup(reply.decision or st.schedule_state)
    )
    rows: list[tuple[str, str]] = []
    if reply.message:
        rows.append(("Why", reply.message))
    if reply.would_be_placed:
        rows.append(("Next cycle", "places its gang minimum"))
    if reply.queue_position:
        rows.append(
            (
                "Turn",
                f"{_ordinal(reply.queue_position)} of {reply.queue_waiting} waiting jobs in queue {meta.queue}",
            )
        )
    if reply.ahead:
        more = f", and {reply.ahead_more} more" if reply.ahead_more else ""
        rows.append(("Ahead of it", ", ".join(reply.ahead) + more))
    if reply.HasField("queue"):
        q = reply.queue
        rows.append(
            (
                f"Queue {q.name}",
                f"holds {_amount(q.status.allocated)}; deserves {_amount(q.status.deserved)}; "
                f"capability {_capability(q.capability) or 'none'}",
            )
        )
    for fit in reply.fits:
        why = ", ".join(f"{r.nodes} {r.reason}" for r in fit.rejected)
        rows.append(
            (
                f"{fit.pod} x{fit.count}",
                f"{fit.fitting_nodes}/{fit.total_nodes} nodes fit now"
                + (f"; {why}" if why else ""),
            )
        )
    if reply.reservation:
        rows.append(("Reservation", reply.reservation))
    for n, victim in enumerate(reply.could_preempt):
        needed = f": {victim.why}" if victim.why else ""
        rows.append(
            ("Would evict" if n == 0 else "", f"{victim.pods} pods of {victim.job}{needed}")
        )
    for refusal in reply.preemption_refused:
        verb = "not tried" if refusal.reason == "PreemptionNotTried" else "refused"
        rows.append((refusal.action.capitalize(), f"{verb} ({refusal.reason}): {refusal.message}"))
    if reply.HasField("estimated_start"):
        when = reply.estimated_start.ToNanoseconds() / 1e9
        rows.append(
            (
                "Estimated start",
                f"{time.strftime('%H:%M:%S', time.localtime(when))} "
                f"(in {age(when - time.time())}), when running jobs reach their maxRuntimeSeconds",
            )
        )
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for key, value in rows:
        grid.add_row(Text(inert(key)), Text(inert(value)))
    console.print(grid)
