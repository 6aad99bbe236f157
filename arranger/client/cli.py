"""cli is the `arranger` command: a local dev cluster, the daemons, and every client command.

User mistakes (bad YAML, unknown job, server unreachable) print one line on stderr and exit 1;
tracebacks are for bugs only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import yaml
from rich.console import Console

from arranger import __version__
from arranger.client import render
from arranger.client.history import add_history_arguments, show_history
from arranger.client.package import shipped_line, working_dir_of
from arranger.client.sdk import (
    FINISHED,
    ArrangerError,
    Client,
    default_server,
    progress_of,
    queue_message,
)
from arranger.client.specfile import SpecFileError, load_job_file
from arranger.client.tokens import CommandError, add_token_arguments
from arranger.quantity import format_memory
from arranger.v1 import arranger_pb2, job_pb2

if TYPE_CHECKING:
    pass

T = TypeVar("T")


EXIT_USAGE = 2
console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
errors = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 200)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return handler(args)
    except (ArrangerError, SpecFileError, CommandError, ValueError, OSError) as exc:
        errors.print(f"[bold red]error:[/] {exc}", markup=True, soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="arranger",
        description="Schedule distributed RL jobs (a learner plus actors) on plain GPU machines.",
        epilog="Start with `arranger dev --demo`. Docs: the README's Quickstart.",
    )
    parser.add_argument("--version", action="version", version=f"arranger {__version__}")
    parser.add_argument(
        "--server", default=None, metavar="HOST:PORT[,HOST:PORT]",
        help="arranger-server to talk to; several (comma-separated) share one store, and the "
        f"active one is found (default $ARRANGER_SERVER or {default_server()})",
    )  # fmt: skip
    parser.add_argument(
        "--ca", default=None, metavar="FILE",
        help="CA certificate to trust: talk TLS (default $ARRANGER_CA; none: plain, as in dev)",
    )  # fmt: skip
    parser.add_argument(
        "--token", default=None, metavar="TOKEN",
        help="bearer token from `arranger token create` (default $ARRANGER_TOKEN)",
    )  # fmt: skip
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    from arranger.agent.main import add_agent_arguments  # noqa: PLC0415 (daemon code loads lazily)
    from arranger.client.dev import add_dev_arguments  # noqa: PLC0415
    from arranger.server.main import add_server_arguments  # noqa: PLC0415
    from arranger.sim.main import add_simulate_arguments  # noqa: PLC0415

    add_dev_arguments(
        sub.add_parser("dev", help="run a server and local agents in one process (try it here)")
    )
    add_server_arguments(sub.add_parser("server", help="run arranger-server"))
    add_agent_arguments(sub.add_parser("agent", help="run arranger-agent"))

    p = sub.add_parser("submit", help="submit a job from a YAML file")
    p.add_argument("file", help="TYJob YAML file")
    p.add_argument(
        "--wait", action="store_true", help="wait until the job finishes; exit 0 if it succeeded"
    )
    _output(p)
    p.add_argument(
        "--working-dir", metavar="DIR", default=None,
        help="pack DIR (honouring .gitignore and .arrangerignore) and start every pod in its "
        "copy; overrides spec.workingDir",
    )  # fmt: skip
    p.set_defaults(handler=cmd_submit)

    p = sub.add_parser("list", aliases=["ls"], help="list jobs")
    p.add_argument("--queue", default="", help="only jobs of this queue")
    p.add_argument(
        "--stage", action="append", default=[], help="only jobs in this stage (repeatable)"
    )
    who = p.add_mutually_exclusive_group()
    who.add_argument("--user", default="", metavar="USER", help="only this user's jobs")
    who.add_argument("--mine", action="store_true", help="only your jobs")
    _output(p)
    p.set_defaults(handler=cmd_list)

    p = sub.add_parser("get", help="show one job and its pods")
    p.add_argument("job", help="job name or id")
    _output(p)
    p.set_defaults(handler=cmd_get)

    p = sub.add_parser(
        "explain", help="why a job is where it is: its turn, queue, nodes, reservations"
    )
    p.add_argument("job", help="job name or id")
    _output(p)
    p.set_defaults(handler=cmd_explain)

    p = sub.add_parser("watch", help="print jobs' changes as they happen")
    p.add_argument("job", nargs="?", default="", help="job name or id (default: every job)")
    p.add_argument(
        "-o", "--output", choices=("table", "json", "yaml"), default="table",
        help="json: one message a line; yaml: one document each (table: a line per change)",
    )  # fmt: skip
    p.set_defaults(handler=cmd_watch)

    p = sub.add_parser("logs", help="print a pod's log (stdout and stderr)")
    p.add_argument("job", help="job name or id")
    p.add_argument(
        "--pod", default="", help="pod name, or its suffix like actors-0 (default: the leader)"
    )
    p.add_argument(
        "--attempt", type=int, default=None, help="attempt number, from 0 (default: the latest)"
    )
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the pod ends")
    p.add_argument(
        "--tail", type=int, default=0, metavar="BYTES", help="start this many bytes before the end"
    )
    p.set_defaults(handler=cmd_logs)

    p = sub.add_parser(
        "stop", help="end a job (it Succeeds); cleanPodPolicy decides what is stopped"
    )
    p.add_argument("job")
    p.set_defaults(handler=cmd_stop)

    p = sub.add_parser(
        "delete", help="stop a job and remove it, its logs and events (its history stays)"
    )
    p.add_argument("job")
    p.set_defaults(handler=cmd_delete)

    p = sub.add_parser("nodes", help="list nodes with capacity, allocation and GPUs")
    _output(p)
    p.set_defaults(handler=cmd_nodes)

    for name, verb in (
        ("cordon", "stop placing new pods on"),
        ("uncordon", "place new pods again on"),
    ):
        p = sub.add_parser(name, help=f"{verb} a node")
        p.add_argument("node")
        p.set_defaults(handler=cmd_cordon, cordon=name == "cordon")
    p = sub.add_parser(
        "drain", help="cordon a node and move its pods elsewhere (no restart counted)"
    )
    p.add_argument("node")
    p.set_defaults(handler=cmd_drain)

    p = sub.add_parser("queues", help="list queues: weight, capability, what they hold and deserve")
    _output(p)
    p.set_defaults(handler=cmd_queues)
    queue = sub.add_parser("queue", help="create, update or delete a queue").add_subparsers(
        title="queue commands", metavar="ACTION"
    )
    for action, text in (("create", "create a queue"), ("update", "change a queue's settings")):
        p = queue.add_parser(action, help=text)
        p.add_argument("name")
        p.add_argument(
            "--weight",
            type=float,
            help="share of the cluster, relative to other queues (default 1)",
        )
        p.add_argument("--cpu", help="capability: at most this many cores (e.g. 64, 500m)")
        p.add_argument("--memory", help="capability: at most this much memory (e.g. 256Gi)")
        p.add_argument("--gpu", type=float, help="capability: at most this many GPUs")
        p.add_argument("--machine-group", action="append", default=None, metavar="GROUP",
                       help="a private machine group this queue's jobs may use (repeatable)")  # fmt: skip
        p.add_argument("--user", action="append", default=None, metavar="USER", dest="users",
                       help="a user who may submit to it (repeatable; none: everyone)")  # fmt: skip
        p.add_argument("--max-priority", type=int, help="the highest priority its jobs may ask")
        p.add_argument(
            "--allow-non-preemptible", action=argparse.BooleanOptionalAction, default=None,
            help="whether its jobs may say preemptible: false (default: no)",
        )  # fmt: skip
        if action == "update":
            p.add_argument("--no-capability", action="store_true", help="remove every cap")
            p.add_argument("--everyone", action="store_true", help="let every user submit")
            p.add_argument("--no-max-priority", action="store_true", help="allow any priority")
        p.set_defaults(handler=cmd_queue_put, action=action)
    p = queue.add_parser("delete", help="delete a queue that no unfinished job uses")
    p.add_argument("name")
    p.set_defaults(handler=cmd_queue_delete)

    p = sub.add_parser("events", help="list the event history (of one job, or all)")
    p.add_argument("job", nargs="?", default="")
    p.add_argument("--limit", type=int, default=200)
    _output(p)
    p.set_defaults(handler=cmd_events)

    p = sub.add_parser(
        "history",
        help="accounting of finished jobs: times, exit codes, nodes, core/GPU/memory hours",
        description="Every finished job's record, kept after it is deleted or pruned (for the "
        "server's history retention). T is an ISO date or datetime, or an age like 7d, 12h.",
    )
    add_history_arguments(p, cmd_history)

    p = sub.add_parser(
        "certs",
        help="make a CA and TLS certificates for the server and agents (mutual TLS)",
        description="Writes ca.pem/ca.key, server.pem/server.key and NAME.pem/NAME.key per agent.",
    )
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="where to write them")
    p.add_argument(
        "--server-host", action="append", default=[], metavar="HOST",
        help="a name or IP clients and agents use for the server (repeat; localhost is added)",
    )  # fmt: skip
    p.add_argument(
        "--agent", action="append", default=[], metavar="NAME", help="an agent's node name (repeat)"
    )
    p.add_argument("--days", type=int, default=3650, help="validity (default 3650)")
    p.set_defaults(handler=cmd_certs)

    add_token_arguments(sub)

    add_simulate_arguments(
        sub.add_parser(
            "simulate",
            help="replay a GPU cluster trace through the scheduling core (no server needed)",
        )
    )
    return parser


def _output(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")


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
    spec = load_job_file(args.file)
    directory = args.working_dir or working_dir_of(spec, args.file)
    with _client(args) as client:
        out = console if args.output == "table" else errors
        job = client.submit(spec, directory, lambda done: out.print(shipped_line(done)))
        if args.output != "table":
            render.dump(job, args.output, console)
        else:
            console.print(f"job [bold]{job.metadata.name}[/] submitted (id {job.metadata.id})")
        if not args.wait:
            return 0
        done = client.wait(job.metadata.id)  # this run, even if the name is reused
    st = done.status
    console.print(f"job {done.metadata.name} {render.stage(st.stage)}: {st.message}")
    return 0 if st.stage == "Succeeded" else 1


def cmd_list(args: argparse.Namespace) -> int:
    with _client(args) as client:
        jobs = client.jobs(args.queue, args.stage, owner=args.user, mine=args.mine)
    if args.output != "table":
        render.dump(jobs, args.output, console)
    elif not jobs:
        console.print("no jobs")
    else:
        render.print_jobs(jobs, console)
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = client.get(args.job)
    if args.output != "table":
        render.dump(job, args.output, console)
    else:
        render.job_detail(job, console)
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    with _client(args) as client:
        reply = client.explain(args.job)
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
    plain = render.as_dict(event)
    if output == "json":
        print(json.dumps(plain, separators=(",", ":")), flush=True)
    else:
        print("---\n" + yaml.safe_dump(plain, sort_keys=False), end="", flush=True)


def _print_change(
    event: arranger_pb2.WatchJobsResponse, progress: job_pb2.JobProgress | None,
    workers: dict[str, int], shown: dict[str, tuple[str, ...]],
) -> None:  # fmt: skip
    stamp = time.strftime("%H:%M:%S")
    if event.type == "DELETED":
        console.print(f"{stamp}  {event.name:<24} deleted")
        return
    for pod in event.pods:
        line = (pod.state, pod.node, pod.reason, str(pod.attempt))
        if shown.get(f"{event.id}/{pod.name}") != line:
            shown[f"{event.id}/{pod.name}"] = line
            where = f" on {pod.node}" if pod.node else ""
            console.print(
                f"{stamp}    {pod.name:<22} {render.stage(pod.state)}{where}"
                + (f" (attempt {pod.attempt})" if pod.attempt else "")
                + (f": {pod.reason}" if pod.reason else "")
            )
    if progress is not None:
        line = (progress.stage, progress.schedule_state, str(progress.running_workers),
                progress.message)  # fmt: skip
        if shown.get(event.id) != line:
            shown[event.id] = line
            console.print(
                f"{stamp}  {event.name:<24} {render.stage(progress.stage):<12} "
                f"{progress.schedule_state:<16} workers {progress.running_workers}/"
                f"{workers.get(event.id, '?')}  {progress.message}"
            )


def cmd_logs(args: argparse.Namespace) -> int:
    out = sys.stdout.buffer
    with _client(args) as client:
        for chunk in client.log_chunks(args.job, args.pod, args.attempt, args.follow, args.tail):
            if chunk.dropped_bytes:
                errors.print(
                    f"[arranger: {format_memory(chunk.dropped_bytes)} of older output was "
                    "dropped (the agent's maxLogBytes)]",
                    markup=False,
                )
            out.write(chunk.data)
            out.flush()
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = client.stop(args.job)
    console.print(f"job {job.metadata.name} is stopping")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    with _client(args) as client:
        client.delete(args.job)
    console.print(f"job {args.job} deleted")
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
    console.print(f"node {node.name} {'cordoned' if node.cordoned else 'uncordoned'}")
    return 0


def cmd_drain(args: argparse.Namespace) -> int:
    with _client(args) as client:
        node = client.drain(args.node)
    console.print(f"node {node.name} cordoned; its {node.pods} pods are moving elsewhere")
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
            console.print(f"queue {created.name} created")
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


def cmd_queue_delete(args: argparse.Namespace) -> int:
    with _client(args) as client:
        client.delete_queue(args.name)
    console.print(f"queue {args.name} deleted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
