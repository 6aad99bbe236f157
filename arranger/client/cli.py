"""cli is the `arranger` command: a local dev cluster, the daemons, and every client command.

User mistakes (bad YAML, unknown job, server unreachable) print one line on stderr and exit 1;
tracebacks are for bugs only. Ctrl-C ends any command quietly with 130. The commands and their
flags are in parser.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from arranger.client.errors import EXIT_INTERRUPTED, ON_INTERRUPT, UserFacingError
from arranger.client.inert import inert
from arranger.client.parser import Handler, build_parser

EXIT_USAGE = 2
EXIT_CLOSED_PIPE = 141  # as a shell reports a SIGPIPE death (`arranger history | head`)
DAEMONS = ("dev", "server", "agent")
LONG_RUNNING = ("simulate", "top")  # own workers; a terminal to give back: they end as programs do


def main(argv: Sequence[str] | None = None) -> int:
    """main runs the command `argv` names (default: the process's arguments) and returns its
    exit status. Without `argv` it is the process's entry point, and a client command owns
    the process: Ctrl-C ends it at once with 130 and nothing printed (gRPC's tasks still
    pending on the client's loop would otherwise complain as they are torn down), and it ends
    the process itself once its output is flushed, skipping the interpreter's teardown of
    gRPC (about 70 ms, a quarter of a quick command). The long-running commands return."""
    entry = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    command = _command(argv)
    if command not in DAEMONS:
        # gRPC's C core logs handshake and connection failures on stderr, beside our own line;
        # asyncio, the gRPC calls a command leaves pending as it ends early (a reader gone).
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    owned = entry and command not in (*DAEMONS, *LONG_RUNNING)
    # A SIGINT the shell ignores (a background job) stays ignored.
    if owned and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, lambda number, frame: interrupted())
    status = _run(argv, command)
    if owned:
        _leave(status)
    return status


def _run(argv: list[str], command: str) -> int:
    try:
        parser = build_parser(command if not {"-h", "--help"} & set(argv[:1]) else "")
        args = parser.parse_args(argv)
        handler: Handler | None = getattr(args, "handler", None)
        if handler is None:
            parser.print_help()
            return EXIT_USAGE
        _read_token(args)
        _tables_meet_a_closed_pipe_as_print_does()
        return handler(args)
    except BrokenPipeError:
        return closed_pipe()
    except (UserFacingError, ValueError, OSError) as exc:
        report(str(exc))
        return 1
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def report(message: str) -> None:
    """report prints each line of `message` on stderr as `error: LINE` (in red on a terminal):
    one line per problem."""
    color = sys.stderr.isatty() and "NO_COLOR" not in os.environ
    prefix = "\x1b[1;31merror:\x1b[0m" if color else "error:"
    lines = [inert(line) for line in message.splitlines()] or [message]
    sys.stderr.write("".join(f"{prefix} {line}\n" for line in lines))
    sys.stderr.flush()


def closed_pipe() -> int:
    """closed_pipe: whoever read the output has gone (`| head`): stop quietly, as a pipeline's
    commands do, with nothing more written there (the rest of the buffer dropped)."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_CLOSED_PIPE


def _tables_meet_a_closed_pipe_as_print_does() -> None:
    """_tables_meet_a_closed_pipe_as_print_does: a rich Console (tables, colour) whose reader
    has gone raises BrokenPipeError, as print does, so that the command ends quietly with
    EXIT_CLOSED_PIPE like every other; rich's own answer is SystemExit(1)."""
    from rich.console import Console  # noqa: PLC0415 (a table command loads it anyway)

    def on_broken_pipe(console: Console) -> None:
        console.quiet = True  # drops what is left in its buffer, as rich's own answer does
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    Console.on_broken_pipe = on_broken_pipe  # type: ignore[method-assign,assignment]


def _leave(status: int) -> NoReturn:
    """_leave ends the process with `status` after flushing what it printed."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)


def interrupted() -> NoReturn:
    """interrupted ends the process on Ctrl-C with 130 (as a shell reports SIGINT) and nothing
    printed but the end of the line the terminal left unfinished, and what the command asked
    to be said then (ON_INTERRUPT). It leaves at once, without unwinding (the server sees the
    connection end)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    if ON_INTERRUPT:
        sys.stderr.write(ON_INTERRUPT[-1] + "\n")
    _leave(EXIT_INTERRUPTED)


def _command(argv: Sequence[str]) -> str:
    """_command: the subcommand argv names (the first word that is not a global option or its
    value), or ""."""
    words = iter(argv)
    for word in words:
        if word in ("--server", "--ca", "--token", "--token-file"):
            next(words, None)
        elif not word.startswith("-"):
            return word
    return ""


def _read_token(args: argparse.Namespace) -> None:
    """_read_token puts the token --token-file holds in args.token, and warns of one given on
    the command line, where every local account can read it."""
    if getattr(args, "token_file", None):
        from arranger.client.logins import read_token_file  # noqa: PLC0415

        args.token = read_token_file(args.token_file)
    elif getattr(args, "token", None):
        sys.stderr.write(
            "warning: --token is readable by every account on this machine (ps); "
            "use --token-file FILE or $ARRANGER_TOKEN\n"
        )


if __name__ == "__main__":
    sys.exit(main())
