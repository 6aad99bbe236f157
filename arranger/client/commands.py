"""commands carries out the `arranger` client commands: each takes the parsed arguments and
returns the exit status. The parser (cli) imports this module only when such a command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import grpc
import yaml
from rich.console import Console

from arranger.client import experiments, render
from arranger.client.aio import FINISHED
from arranger.client.blocking import Client
from arranger.client.channel import ArrangerError
from arranger.client.errors import EXIT_INTERRUPTED, ON_INTERRUPT
from arranger.client.failure import attempt_shown, print_failure
from arranger.client.follow import follow_leader
from arranger.client.history import show_history
from arranger.client.inert import inert_markup
from arranger.client.messages import progress_of, queue_message
from arranger.client.specfile import load_job_file
from arranger.client.text import as_dict
from arranger.quantity import format_memory
from arranger.v1 import arranger_pb2, job_pb2

# How `submit --wait` exits: by the job's outcome (a job deleted while waited on: Deleted).
WAIT_EXITS = {"Completed": 0, "Failed": 1, "Stopped": 3, "Deleted": 3}

# No emoji: `:smile:` in a server's string is text, as its markup is (see inert).
console = Console(highlight=False, emoji=False, width=None if sys.stdout.isatty() else 200)
errors = Console(
    stderr=True, highlight=False, emoji=False, width=None if sys.stderr.isatty() else 200
)


def _say(text: str) -> None:
    """_say writes a line of the CLI's own to stderr, as it is."""
    errors.print(text, markup=False)


def _client(args: argparse.Namespace) -> Client:
    return Client(args.server, token=args.token, ca=args.ca)


def cmd_certs(args: argparse.Namespace) -> int:
    from arranger.certs import make_certificates  # noqa: PLC0415 (cryptography loads lazily)

    written = make_certificates(args.out, args.server_host, args.agent, args.days)
    for path in written:
        console.print(str(path))
    console.print(
        "[dim]server: tls {ca: ca.pem, cert: server.pem, key: server.key}; each agent: "
        "ca.pem and its NAME.pem/NAME.key; users: ca.pem (--ca) and a token.[/]"
    )
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from arranger.client.package import working_dir_of  # noqa: PLC0415

    spec = load_job_file(args.file, args.sets)
    directory = args.working_dir or working_dir_of(spec, args.file)  # "-": the current one
    return submit_spec(args, spec, directory)


def submit_spec(args: argparse.Namespace, spec: job_pb2.TYJob, directory: str | Path | None) -> int:
    """submit_spec submits a checked job (shipping `directory` with it, when given) as
    `submit` and `run` do: its warnings, its line or document, and with `--wait` the learner's
    log as it comes (see follow; not with -o json|yaml) and the job's end."""
    from arranger.client.package import shipped_line, warn_unshipped  # noqa: PLC0415

    warn_unshipped(spec, directory)  # a local file the pod would not find
    with _client(args) as client:
        out = console if args.output == "table" else errors
        reply = client.submit_job(
            spec,
            directory,
            lambda done: out.print(shipped_line(done)),
            queue_anyway=args.queue_anyway,
        )
        for warning in reply.warnings:  # the job is queued all the same
            errors.print(f"[bold yellow]warning:[/] {inert_markup(warning)}", soft_wrap=True)
        if reply.HasField("experiment"):  # a spec with a sweep
            return experiments.submit_experiment(args, client, reply.experiment, console, errors)
        job = reply.job
        name, id_ = inert_markup(job.metadata.name), inert_markup(job.metadata.id)
        if args.wait:  # before the line that says it was submitted: Ctrl-C may follow it at once
            ON_INTERRUPT.append(
                f"job {job.metadata.name} runs on; `arranger stop {job.metadata.id}` stops it"
            )
        if args.output != "table":
            render.dump(job, args.output, console)
        else:
            console.print(f"job [bold]{name}[/] submitted (id {id_})")
        if not args.wait:
            return 0
        streamed = args.output == "table" and job.spec.clean_pod_policy != "None"
        try:  # by id: this run, even if the name is reused
            if streamed:
                done = follow_leader(client, job.metadata.id, sys.stdout.buffer, _say)
            else:
                done = client.wait(job.metadata.id)
        except KeyboardInterrupt:  # (a process that is not the CLI's own: the SDK's caller)
            errors.print(ON_INTERRUPT[-1], markup=False)
            return EXIT_INTERRUPTED
        except ArrangerError as exc:
            if exc.code != grpc.StatusCode.NOT_FOUND:
                raise
            errors.print(f"job {name} was deleted")
            return WAIT_EXITS["Deleted"]
        finally:
            ON_INTERRUPT.clear()
        st = done.status
        console.print(
            f"job {inert_markup(done.metadata.name)} {render.stage(st.stage)}: "
            + inert_markup(st.message)
        )
        print_failure(client, done, console)
    return WAIT_EXITS.get(st.outcome, 0 if st.stage == "Succeeded" else 1)


def cmd_get(args: argparse.Namespace) -> int:
    """cmd_get shows a job and its pods, or an experiment and its members (see experiments)."""
    with _client(args) as client:
        job = experiments.job_or_experiment(args.job, client.get, client.get_experiment)
        if isinstance(job, job_pb2.Experiment):
            return experiments.show_experiment(job, args, console)
        if args.output == "csv" or args.sort:
            raise ValueError(f"{'--sort' if args.sort else '-o csv'}: only for an experiment")
        if args.output != "table":
            render.dump(job, args.output, console)
        else:
            render.job_detail(job, console)
            print_failure(client, job, console)
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    with _client(args) as client:
        reply = experiments.job_or_experiment(args.job, client.explain, client.get_experiment)
        if isinstance(reply, job_pb2.Experiment):
            return experiments.explain_experiment(client, reply, args.output, console)
    if args.output != "table":
        render.dump(reply, args.output, console)
    else:
        render.explanation(reply, console)
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    """cmd_watch prints a line per pod whose state, node or reason changed, then one for the
    job when its stage, schedule state, running workers or message changed; with a job named, it exits
    when that job finishes (0 if it succeeded)."""
    workers: dict[str, int] = {}
    shown: dict[str, tuple[str, ...]] = {}
    with _client(args) as client:
        for event in client.watch(args.job):
            if args.output != "table":
                _dump_event(event, args.output)
            progress = progress_of(event)
            if event.type == "ADDED":
                workers[event.id] = event.summary.workers
            if args.output == "table":
                _print_change(event, progress, workers, shown)
            if event.type == "DELETED":
                workers.pop(event.id, None)
                if args.job:
                    return 1
            if args.job and progress is not None and progress.stage in FINISHED:
                return 0 if progress.stage == "Succeeded" else 1
    return 0


def _dump_event(event: arranger_pb2.WatchJobsResponse, output: str) -> None:
    plain = as_dict(event)
    if output == "json":
        print(json.dumps(plain, separators=(",", ":")), flush=True)
    else:
        print("---\n" + yaml.safe_dump(plain, sort_keys=False), end="", flush=True)


def _print_change(
    event: arranger_pb2.WatchJobsResponse,
    progress: job_pb2.JobProgress | None,
    workers: dict[str, int],
    shown: dict[str, tuple[str, ...]],
) -> None:
    stamp = time.strftime("%H:%M:%S")
    if event.type == "DELETED":
        console.print(f"{stamp}  {inert_markup(event.name):<24} deleted")
        return
    for pod in event.pods:
        line = (pod.state, pod.node, pod.reason, str(pod.attempt))
        if shown.get(f"{event.id}/{pod.name}") != line:
            shown[f"{event.id}/{pod.name}"] = line
            where = f" on {inert_markup(pod.node)}" if pod.node else ""
            console.print(
                f"{stamp}    {inert_markup(pod.name):<22} {render.stage(pod.state)}{where}"
                + (f" (attempt {pod.attempt})" if pod.attempt else "")
                + (f": {inert_markup(pod.reason)}" if pod.reason else "")
            )
    if progress is not None:
        line = (
            progress.stage,
            progress.schedule_state,
            str(progress.running_workers),
            progress.message,
        )
        if shown.get(event.id) != line:
            shown[event.id] = line
            console.print(
                f"{stamp}  {inert_markup(event.name):<24} {render.stage(progress.stage):<12} "
                f"{inert_markup(progress.schedule_state):<16} workers {progress.running_workers}/"
                f"{workers.get(event.id, '?')}  {inert_markup(progress.message)}"
            )


def cmd_logs(args: argparse.Namespace) -> int:
    out = sys.stdout.buffer
    with _client(args) as client:
        for chunk in client.log_chunks(
            args.job, args.pod, args.attempt, args.follow, tail_lines=args.tail
        ):
            if chunk.HasField("attempt") and chunk.latest_attempt > 0:
                errors.print(f"[arranger: {attempt_shown(chunk)}]", markup=False)
            if chunk.dropped_bytes:
                errors.print(
                    f"[arranger: {format_memory(chunk.dropped_bytes)} of older output was "
                    "dropped (the agent's maxLogBytes)]",
                    markup=False,
                )
            out.write(chunk.data)
            out.flush()
    return 0


def cmd_scale(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = client.scale(args.job, args.worker_set, args.counts)
    sets = {ws.name: ws for ws in job.spec.worker_sets}
    ws = sets[args.worker_set]
    console.print(
        f"job {inert_markup(job.metadata.name)}: set {inert_markup(ws.name)} wants {ws.counts} workers "
        f"(min {ws.min_count}, max {ws.max_counts})"
    )
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    with _client(args) as client:

        def experiment(name: str) -> None:
            experiments.stop_experiment(client, name, console)

        job = experiments.job_or_experiment(args.job, client.stop, experiment)
    if job is not None:
        console.print(f"job {inert_markup(job.metadata.name)} is stopping")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    with _client(args) as client:

        def job(name: str) -> bool:
            client.delete(name)
            return True

        def experiment(name: str) -> bool:
            experiments.delete_experiment(client, name, console)
            return False

        if experiments.job_or_experiment(args.job, job, experiment):
            console.print(f"job {inert_markup(args.job)} deleted")
    return 0


def cmd_nodes(args: argparse.Namespace) -> int:
    with _client(args) as client:
        nodes = client.nodes()
    if args.output != "table":
        render.dump(nodes, args.output, console)
    elif not nodes:
        console.print("no nodes have joined")
    else:
        console.print(render.nodes_table(nodes))
    return 0


def cmd_events(args: argparse.Namespace) -> int:
    with _client(args) as client:
        events = client.events(args.job, args.limit)
    if args.output != "table":
        render.dump(events, args.output, console)
    else:
        console.print(render.events_table(events))
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    with _client(args) as client:
        return show_history(args, client, console)


def cmd_cordon(args: argparse.Namespace) -> int:
    with _client(args) as client:
        node = client.cordon(args.node, args.cordon)
    console.print(f"node {inert_markup(node.name)} {'cordoned' if node.cordoned else 'uncordoned'}")
    return 0


def cmd_drain(args: argparse.Namespace) -> int:
    with _client(args) as client:
        node = client.drain(args.node)
    console.print(
        f"node {inert_markup(node.name)} cordoned; its {node.pods} pods are moving elsewhere"
    )
    return 0


def cmd_queues(args: argparse.Namespace) -> int:
    with _client(args) as client:
        queues = client.queues()
    if args.output != "table":
        render.dump(queues, args.output, console)
    else:
        console.print(render.queues_table(queues))
    return 0


def cmd_queue_put(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.action == "create":
            queue = queue_message(
                args.name,
                args.weight or 1.0,
                args.cpu,
                args.memory,
                args.gpu,
                args.machine_group or (),
            )
            _queue_policy(queue, args)
            created = client.create_queue(queue)
            console.print(f"queue {inert_markup(created.name)} created")
            return 0
        current = next((q for q in client.queues() if q.name == args.name), None)
        if current is None:
            raise ValueError(f"queue {args.name!r} not found")
        queue = arranger_pb2.Queue(name=current.name, weight=args.weight or current.weight)
        if not args.no_capability:
            queue.capability.CopyFrom(current.capability)
        changed = queue_message(args.name, 1.0, args.cpu, args.memory, args.gpu)
        queue.capability.MergeFrom(changed.capability)
        groups = args.machine_group if args.machine_group is not None else current.machine_groups
        queue.machine_groups.extend(groups)
        if not args.everyone:
            queue.users.extend(current.users)
        if current.HasField("max_priority") and not args.no_max_priority:
            queue.max_priority = current.max_priority
        queue.allow_non_preemptible = current.allow_non_preemptible
        queue.min_run_seconds = current.min_run_seconds
        queue.idle_gpu_stop_minutes = current.idle_gpu_stop_minutes
        _queue_policy(queue, args)
        client.update_queue(queue)
    console.print(f"queue {args.name} updated")
    return 0


def _queue_policy(queue: arranger_pb2.Queue, args: argparse.Namespace) -> None:
    """_queue_policy applies the policy flags that were given to `queue`."""
    if args.users is not None:
        del queue.users[:]
        queue.users.extend(args.users)
    if args.max_priority is not None:
        queue.max_priority = args.max_priority
    if args.allow_non_preemptible is not None:
        queue.allow_non_preemptible = args.allow_non_preemptible
    if args.min_run_seconds is not None:
        queue.min_run_seconds = args.min_run_seconds
    if args.idle_gpu_stop_minutes is not None:
        queue.idle_gpu_stop_minutes = args.idle_gpu_stop_minutes


def cmd_queue_delete(args: argparse.Namespace) -> int:
    with _client(args) as client:
        client.delete_queue(args.name)
    console.print(f"queue {args.name} deleted")
    return 0
