"""tokens: `arranger token create|list|delete`, run on the head node against the server's store.

They open the store as the server does (through the store's interface, by its URL: the SQLite
file in --data-dir or --store), for one call, beside a server that may be using it.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from rich.console import Console

from arranger.client import render
from arranger.client.errors import UserFacingError
from arranger.identity import Role
from arranger.security import new_token, token_hash

if TYPE_CHECKING:
    from arranger.server.store import Store

T = TypeVar("T")
TOKEN_NAME = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_.]{0,62}")
console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)


class CommandError(UserFacingError):
    """CommandError: a command could not do its work; the message says why."""


def add_token_arguments(parser: argparse.ArgumentParser) -> None:
    """add_token_arguments adds `create|list|delete` to the CLI's `token` command."""
    token = parser.add_subparsers(title="actions", metavar="ACTION", required=True)
    p = token.add_parser(
        "create",
        help="issue a bearer token for a user (printed once; the server keeps only its hash)",
        description="Run on the head node by whoever may write the server's dataDir: writes "
        "to the server's store. A user may hold several tokens; the first admin token is made "
        "this way too.",
    )
    p.add_argument("--user", required=True, help="the user the token acts as (an account name)")
    p.add_argument(
        "--role",
        choices=[r.value for r in Role],
        default=Role.USER.value,
        help="user (default): own jobs, read the rest; admin: everything",
    )
    p.add_argument("name", nargs="?", default="", help="the token's name (default USER-<hex>)")
    _data_dir(p)
    p.set_defaults(handler=cmd_token_create)
    p = token.add_parser("list", help="the issued tokens: name, user, role, created, last used")
    _data_dir(p)
    p.set_defaults(handler=cmd_token_list)
    p = token.add_parser("delete", help="revoke a token (refused, its streams ended, within 2 s)")
    p.add_argument("name")
    _data_dir(p)
    p.set_defaults(handler=cmd_token_delete)


def _data_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data-dir",
        type=Path,
        default=Path("/var/lib/arranger"),
        help="the server's dataDir, on the head node (default /var/lib/arranger)",
    )
    p.add_argument(
        "--store",
        metavar="URL",
        default=os.environ.get("ARRANGER_STORE", ""),
        help="the server's store, where it is not arranger.db in --data-dir "
        "(postgresql://user@host/database; default $ARRANGER_STORE)",
    )


def cmd_token_create(args: argparse.Namespace) -> int:
    name = args.name or f"{args.user}-{secrets.token_hex(3)}"
    for what, value in (("token name", name), ("user", args.user)):
        if not TOKEN_NAME.fullmatch(value):
            print(f"error: {what} {value!r}: 1-63 letters, digits, '-', '_', '.'", file=sys.stderr)
            return 1
    secret = new_token()
    digest, now = token_hash(secret), time.time()
    _on_store(args, lambda store: store.add_token(name, args.user, args.role, digest, now))
    # Alone on stdout, for scripts: export ARRANGER_TOKEN=$(arranger token create --user ci)
    print(secret)
    return 0


def cmd_token_list(args: argparse.Namespace) -> int:
    console.print(render.tokens_table(_on_store(args, lambda store: store.list_tokens())))
    return 0


def cmd_token_delete(args: argparse.Namespace) -> int:
    if not _on_store(args, lambda store: store.delete_token(args.name)):
        print(f"error: no token named {args.name!r}", file=sys.stderr)
        return 1
    console.print(f"token [bold]{args.name}[/] revoked")
    return 0


def _on_store(args: argparse.Namespace, work: Callable[[Store], Awaitable[T]]) -> T:
    """_on_store: what `work` gives on the server's store, opened as the server opens it (on
    the head node, by whoever may). A store that cannot be used is a CommandError."""
    from arranger.server.store import (  # noqa: PLC0415
        StoreError,
        on_store,
        password_warning,
        sqlite_url,
    )

    if args.store and args.store != os.environ.get("ARRANGER_STORE"):  # on the command line
        warning = password_warning(args.store, "--store")
        if warning:
            print(warning, file=sys.stderr)
    try:
        return on_store(args.store or sqlite_url(args.data_dir / "arranger.db"), work)
    except StoreError as exc:
        raise CommandError(str(exc)) from exc
