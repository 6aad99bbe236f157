"""parser is the `arranger` command line: every command, its flags, and the handler that runs it.

Parsing imports nothing heavy: a client command's module (commands, with gRPC) loads when it
runs, and the daemons' and the simulator's modules load only when their command is chosen, so
`arranger list` costs the client's imports and no more.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from arranger import __version__
from arranger.client.address import default_server
from arranger.client.overrides import add_set_arguments
from arranger.states import Stage

Handler = Callable[[argparse.Namespace], int]
LIST_HELP = "list jobs and experiments (unfinished ones unless --all or --stage)"


def run(name: str, module: str = "commands") -> Handler:
    """run: the handler of client command `name`, cmd_<name> of arranger.client.<module>, which
    is imported when the command runs."""

    def handler(args: argparse.Namespace) -> int:
        commands = importlib.import_module(f"arranger.client.{module}")
        command: Handler = getattr(commands, f"cmd_{name}")
        return command(args)

    return handler


def stage_name(text: str) -> str:
    """stage_name: the job stage `text` names, in any case; argparse refuses any other."""
    for stage in Stage:
        if stage.value.lower() == text.strip().lower():
            return stage.value
    raise argparse.ArgumentTypeError(f"unknown stage {text!r}: one of {', '.join(Stage)}")


class LazyParser(argparse.ArgumentParser):
    """LazyParser is a subcommand's parser whose arguments `load` adds the first time it parses
    (or prints its help), so a command's module is imported only when that command is chosen.

    With `rest`, the words after the first `--` are that attribute, one or more, whatever they
    look like, and the options may come before or after JOB (`arranger exec JOB -it -- bash
    -l`): argparse's own `--` cannot place a list of words after options."""

    def __init__(
        self,
        *args: Any,
        load: Callable[[argparse.ArgumentParser], None] | None = None,
        rest: str = "",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._load = load
        self._rest = rest

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._load is not None:
            load, self._load = self._load, None
            load(self)
        if not self._rest:
            return super().parse_known_args(args, namespace)
        words = list(sys.argv[1:] if args is None else args)
        cut = words.index("--") if "--" in words else len(words)
        parsed, extra = super().parse_known_args(words[:cut], namespace)
        if extra:
            self.error(f"unrecognized arguments: {' '.join(extra)} (the command goes after --)")
        setattr(parsed, self._rest, words[cut + 1 :])
        if not words[cut + 1 :]:
            self.error("no command: give it after --, as in `-- nvidia-smi`")
        return parsed, []


class _Skipped:
    """_Skipped stands in for the parser of a command that is not built: whatever is added to
    it is dropped."""

    def __getattr__(self, name: str) -> Callable[..., _Skipped]:
        return lambda *args, **kwargs: self


SKIPPED = _Skipped()


def _add_dev(p: argparse.ArgumentParser) -> None:
    from arranger.client.dev import add_dev_arguments  # noqa: PLC0415

    add_dev_arguments(p)


def _add_server(p: argparse.ArgumentParser) -> None:
    from arranger.server.main import add_server_arguments  # noqa: PLC0415

    add_server_arguments(p)


def _add_agent(p: argparse.ArgumentParser) -> None:
    from arranger.agent.main import add_agent_arguments  # noqa: PLC0415

    add_agent_arguments(p)


def _add_run(p: argparse.ArgumentParser) -> None:
    from arranger.client.run_command import add_run_arguments  # noqa: PLC0415

    add_run_arguments(p)


def _add_exec(p: argparse.ArgumentParser) -> None:
    from arranger.client.exec_command import add_exec_arguments  # noqa: PLC0415

    add_exec_arguments(p)


def _loader(name: str) -> Callable[[argparse.ArgumentParser], None]:
    """_loader: a `load` that adds the flags listing_args.<name> adds (list's, get's)."""

    def load(p: argparse.ArgumentParser) -> None:
        getattr(importlib.import_module("arranger.client.listing_args"), name)(p)

    return load


def _add_history(p: argparse.ArgumentParser) -> None:
    from arranger.client.history import add_history_arguments  # noqa: PLC0415

    add_history_arguments(p, run("history"))


def _add_token(p: argparse.ArgumentParser) -> None:
    from arranger.client.tokens import add_token_arguments  # noqa: PLC0415

    add_token_arguments(p)


def _add_top(p: argparse.ArgumentParser) -> None:
    from arranger.client.top import add_top_arguments  # noqa: PLC0415

    add_top_arguments(p)


def _add_simulate(p: argparse.ArgumentParser) -> None:
    from arranger.sim.main import add_simulate_arguments  # noqa: PLC0415

    add_simulate_arguments(p)


def build_parser(only: str = "") -> argparse.ArgumentParser:
    """build_parser: the `arranger` parser. With `only` (a command's name), the other commands'
    parsers are not built (building them all costs more than a quick command takes to run);
    a name that is no command builds them all, so argparse lists them when it refuses it."""
    if only:
        parser, found = _parser(only)
        if found:
            return parser
    return _parser("")[0]


def _parser(only: str) -> tuple[argparse.ArgumentParser, bool]:
    """_parser: the parser with every command, or with `only` that one, and whether it was."""
    parser = argparse.ArgumentParser(
        prog="arranger",
        description="Schedule distributed RL jobs (a learner plus actors) on plain GPU machines.",
        epilog="Start with `arranger dev --demo`. Docs: the README's Quickstart.",
    )
    parser.add_argument("--version", action="version", version=f"arranger {__version__}")
    parser.add_argument(
        "--server",
        default=None,
        metavar="HOST:PORT[,HOST:PORT]",
        help="arranger-server to talk to; several (comma-separated) share one store, and the "
        f"active one is found (default $ARRANGER_SERVER or {default_server()})",
    )
    parser.add_argument(
        "--ca",
        default=None,
        metavar="FILE",
        help="CA certificate to trust: talk TLS (default $ARRANGER_CA; none: plain, as in dev)",
    )
    parser.add_argument(
        "--token-file",
        default=None,
        metavar="FILE",
        help="file holding the bearer token from `arranger token create`, mode 600 (default "
        "$ARRANGER_TOKEN_FILE, or the token in $ARRANGER_TOKEN)",
    )
    parser.add_argument(
        "--token",
        default=None,
        metavar="TOKEN",
        help="the bearer token itself: avoid it, every account on this machine reads it in ps "
        "(use --token-file or $ARRANGER_TOKEN)",
    )
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=LazyParser)
    found = False

    def add(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        nonlocal found
        if only and only != name and only not in kwargs.get("aliases", ()):
            return cast(argparse.ArgumentParser, SKIPPED)
        found = True
        return subparsers.add_parser(name, **kwargs)

    add("dev", help="run a server and local agents in one process (try it here)", load=_add_dev)
    add("server", help="run arranger-server", load=_add_server)
    add("agent", help="run arranger-agent", load=_add_agent)

    p = add("submit", help="submit a job from a YAML file")
    p.add_argument("file", help="TYJob YAML file, or - to read it from standard input")
    add_set_arguments(p, "a field of the file")
    p.add_argument(
        "--wait",
        action="store_true",
        help="wait until the job (an experiment: every member) ends; exit 0 if it completed, "
        "1 if it (one) failed, else 3 if stopped or deleted (Ctrl-C: 130, it runs on)",
    )
    _output(p)
    p.add_argument(
        "--working-dir",
        metavar="DIR",
        default=None,
        help="pack DIR (honouring .gitignore and .arrangerignore) and start every pod in its "
        "copy; overrides spec.workingDir",
    )
    p.add_argument(
        "--queue-anyway",
        action="store_true",
        help="queue a job no registered node could ever hold (a node may join); refused otherwise",
    )
    p.set_defaults(handler=run("submit"))

    p = add("list", aliases=["ls"], help=LIST_HELP, load=_loader("add_list_arguments"))
    p.set_defaults(handler=run("list", "joblist"))

    help_get = "show one job and its pods, or an experiment and its members"
    p = add("get", help=help_get, load=_loader("add_get_arguments"))
    p.set_defaults(handler=run("get"))

    p = add("top", help="what unfinished jobs, or one job's pods, use now", load=_add_top)
    p.set_defaults(handler=run("top", "top"))

    p = add("explain", help="why a job (an experiment's first pending member) is where it is")
    p.add_argument("job", metavar="NAME", help="job or experiment, by name or id")
    _output(p)
    p.set_defaults(handler=run("explain"))

    p = add("watch", help="print jobs' changes as they happen")
    p.add_argument("job", nargs="?", default="", help="job name or id (default: every job)")
    p.add_argument(
        "-o",
        "--output",
        choices=("table", "json", "yaml"),
        default="table",
        help="json: one message a line; yaml: one document each (table: a line per change)",
    )
    p.set_defaults(handler=run("watch"))

    p = add("logs", help="print a pod's log (stdout and stderr)")
    p.add_argument("job", help="job name or id")
    p.add_argument(
        "--pod", default="", help="pod name, or its suffix like actors-0 (default: the leader)"
    )
    p.add_argument(
        "--attempt", type=int, default=None, help="attempt number, from 0 (default: the latest)"
    )
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the pod ends")
    p.add_argument(
        "--tail", type=_lines, default=0, metavar="N", help="start N lines before the end"
    )
    p.set_defaults(handler=run("logs"))

    help_run = "submit a job without a YAML file: the command after -- is the learner's"
    p = add("run", help=help_run, load=_add_run, rest="command")
    p.set_defaults(handler=run("run", "run_command"))

    p = add(
        "exec",
        help="run a command in a running pod (the job's owner or an admin): -it for a shell",
        load=_add_exec,
        rest="command",
    )
    p.set_defaults(handler=run("exec", "exec_command"))

    p = add("scale", help="set how many workers of a set a job wants (within min and max)")
    p.add_argument("job", help="job name or id")
    p.add_argument("worker_set", metavar="SET", help="the worker set's name")
    p.add_argument("counts", metavar="N", type=int, help="the number of workers wanted")
    p.set_defaults(handler=run("scale"))

    p = add("stop", help="end a job or every member of an experiment (a job stopped Succeeds)")
    p.add_argument("job", metavar="NAME", help="job or experiment, by name or id")
    p.set_defaults(handler=run("stop"))

    p = add("delete", help="stop and remove a job (or an experiment's members), logs, events")
    p.add_argument("job", metavar="NAME", help="job or experiment, by name or id")
    p.set_defaults(handler=run("delete"))

    p = add("nodes", help="list nodes with capacity, allocation and GPUs")
    _output(p)
    p.set_defaults(handler=run("nodes"))

    for name, verb in (
        ("cordon", "stop placing new pods on"),
        ("uncordon", "place new pods again on"),
    ):
        p = add(name, help=f"{verb} a node")
        p.add_argument("node")
        p.set_defaults(handler=run("cordon"), cordon=name == "cordon")
    p = add("drain", help="cordon a node and move its pods elsewhere (no restart counted)")
    p.add_argument("node")
    p.set_defaults(handler=run("drain"))

    p = add("queues", help="list queues: weight, capability, what they hold and deserve")
    _output(p)
    p.set_defaults(handler=run("queues"))
    queue = add("queue", help="create, update or delete a queue").add_subparsers(
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
        p.add_argument(
            "--machine-group",
            action="append",
            default=None,
            metavar="GROUP",
            help="a private machine group this queue's jobs may use (repeatable)",
        )
        p.add_argument(
            "--user",
            action="append",
            default=None,
            metavar="USER",
            dest="users",
            help="a user who may submit to it (repeatable; none: everyone)",
        )
        p.add_argument("--max-priority", type=int, help="the highest priority its jobs may ask")
        p.add_argument(
            "--allow-non-preemptible",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="whether its jobs may say preemptible: false (default: no)",
        )
        p.add_argument(
            "--min-run-seconds",
            type=float,
            metavar="S",
            help="its pods that ran less are not evicted by preempt or reclaim (default 0: off)",
        )
        p.add_argument(
            "--idle-gpu-stop-minutes",
            type=float,
            metavar="M",
            help="stop a job this long after a pod's GPUs were found idle (the server's "
            "idleGpuMinutes; default 0: never)",
        )
        if action == "update":
            p.add_argument("--no-capability", action="store_true", help="remove every cap")
            p.add_argument("--everyone", action="store_true", help="let every user submit")
            p.add_argument("--no-max-priority", action="store_true", help="allow any priority")
        p.set_defaults(handler=run("queue_put"), action=action)
    p = queue.add_parser("delete", help="delete a queue that no unfinished job uses")
    p.add_argument("name")
    p.set_defaults(handler=run("queue_delete"))

    p = add("events", help="list the event history (of one job, or all)")
    p.add_argument("job", nargs="?", default="")
    p.add_argument("--limit", type=int, default=200)
    _output(p)
    p.set_defaults(handler=run("events"))

    p = add(
        "history",
        help="accounting of ended jobs: times, outcome, exit codes, nodes, core/GPU/memory hours",
        description="Every finished job's record, and every job's deleted before it finished, "
        "kept after it is deleted or pruned (for the server's history retention). T is an ISO "
        "date or datetime, or an age like 7d, 12h. OUTCOME: Completed (the leader succeeded), "
        "Failed, Stopped (arranger stop; its stage is Succeeded) or Deleted (deleted before it "
        "finished). EXIT: the leader's exit code, then after ';' how many workers ended with "
        "each code, as in '0; 3x0 1x143(SIGTERM) 2xnone': a code above 128 is 128 + the signal "
        "that killed it (137 SIGKILL, 143 SIGTERM), 'none' is no code (the pod never ran, or "
        "was lost). -o csv and -o json give each pod's code too (pod_exit_codes, podExits).",
        load=_add_history,
    )

    p = add(
        "certs",
        help="make a CA and TLS certificates for the server and agents (mutual TLS)",
        description="Writes ca.pem/ca.key, server.pem/server.key and NAME.pem/NAME.key per agent.",
    )
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="where to write them")
    p.add_argument(
        "--server-host",
        action="append",
        default=[],
        metavar="HOST",
        help="a name or IP clients and agents use for the server (repeat; localhost is added)",
    )
    p.add_argument(
        "--agent", action="append", default=[], metavar="NAME", help="an agent's node name (repeat)"
    )
    p.add_argument("--days", type=int, default=3650, help="validity (default 3650)")
    p.set_defaults(handler=run("certs"))

    add("token", help="issue, list and revoke API tokens", load=_add_token)

    add(
        "simulate",
        help="replay a GPU cluster trace through the scheduling core (no server needed)",
        load=_add_simulate,
    )
    return parser, found


def _lines(text: str) -> int:
    """_lines: a count of lines, 0 or more (argparse names the option when this refuses)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number of lines, got {text!r}"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more lines, got {value}")
    return value


def _output(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
