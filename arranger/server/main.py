"""main is the arranger-server command (also `arranger server`)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from arranger import __version__, logsetup
from arranger.security import SecurityError
from arranger.server.app import ArrangerServer
from arranger.server.collector import Collector
from arranger.server.config import ConfigError, ServerConfig, load_server_config
from arranger.server.store import StoreError, open_store, password_warning
from arranger.signals import until_stop_signal


def add_server_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="YAML settings file (see arranger/server/config.py)")
    p.add_argument("--listen", help="address to serve on, e.g. 0.0.0.0:50051")
    p.add_argument("--data-dir", type=Path, help="the server's directory (its SQLite store)")
    p.add_argument(
        "--http-listen",
        metavar="ADDR",
        help='address of the HTTP port (/metrics), default 127.0.0.1:50080; "" turns it off',
    )
    p.add_argument(
        "--store",
        metavar="URL",
        default=os.environ.get("ARRANGER_STORE") or None,
        help="the store: sqlite:///path/arranger.db (default: $ARRANGER_STORE, else arranger.db "
        "in dataDir) or postgresql://user@host/database (its password in a .pgpass file, PGPASSFILE; not here)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="serve without TLS and tokens (as if the config said insecure: true)",
    )
    p.add_argument(
        "--init",
        action="store_true",
        help="create the store in dataDir (a new cluster) if it has none, then exit; the "
        "server never makes one by itself",
    )
    p.add_argument(
        "--migrate",
        action="store_true",
        help="migrate a PostgreSQL store of an older release (back it up with pg_dump first; "
        "a SQLite store is copied beside itself before it is migrated, without asking)",
    )
    p.add_argument(
        "--backup",
        type=Path,
        metavar="FILE",
        help="copy the live store to FILE (consistent, while the server runs), then exit",
    )
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.add_argument(
        "--log-format",
        default=os.environ.get("ARRANGER_LOG_FORMAT", "text"),
        choices=logsetup.FORMATS,
        help="text: key=value lines; json: one object a line (default $ARRANGER_LOG_FORMAT or text)",
    )
    p.set_defaults(handler=cmd_server)


def cmd_server(args: argparse.Namespace) -> int:
    logsetup.configure(args.log_level, args.log_format)
    if args.store and args.store != os.environ.get("ARRANGER_STORE"):  # on the command line
        warning = password_warning(args.store, "--store")
        if warning:
            print(warning, file=sys.stderr)
    given = (
        ("listen", args.listen),
        ("data_dir", args.data_dir),
        ("store", args.store),
        ("migrate", args.migrate),
    )
    overrides: dict[str, object] = {k: v for k, v in given if v}
    if args.http_listen is not None:
        overrides["http_listen"] = args.http_listen
    try:
        config = load_server_config(args.config, insecure=args.insecure, **overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        if args.backup:
            print(asyncio.run(backup(config, args.backup)))
            return 0
        if args.init:
            print(asyncio.run(init_store(config)))
            return 0
        # The scheduling core runs in a thread: hand the interpreter back to the event loop
        # (submits, reports, the store's thread) every millisecond, not every 5.
        sys.setswitchinterval(0.001)
        Collector().install()  # no full collection walks every record again (see collector)
        asyncio.run(serve(config))
    except (StoreError, OSError, SecurityError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


async def init_store(config: ServerConfig) -> str:
    """init_store creates the store of a new cluster (or finds the one there) and says so."""
    store = await open_store(
        config.store_url, create=True, exclusive=True, confirmed=config.migrate
    )
    await store.close()
    what = "created a store" if store.created else "found the store"
    return f"{what} at {store.url} (cluster {store.cluster_id})"


async def backup(config: ServerConfig, out: Path) -> str:
    """backup copies the live store to `out` (see Store.backup)."""
    store = await open_store(config.store_url, migrate=False)
    try:
        return await store.backup(out)
    finally:
        await store.close()


async def serve(config: ServerConfig) -> None:
    """serve runs the server until SIGINT or SIGTERM. A server that steps down (another took
    its lease on a shared store) starts again from nothing, as a standby."""
    stopping = asyncio.ensure_future(until_stop_signal())
    try:
        while not stopping.done():
            server = ArrangerServer(config)
            running = asyncio.ensure_future(_until_stepped_down(server))
            try:
                await asyncio.wait({stopping, running}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                running.cancel()
                await server.stop()  # closes what it opened: nothing keeps the process alive
            if running.done() and not running.cancelled():
                running.result()  # a server that could not start says why
    finally:
        stopping.cancel()


async def _until_stepped_down(server: ArrangerServer) -> None:
    await server.start()
    await server.stepped_down.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="arranger-server", description="Run arranger-server.")
    parser.add_argument("--version", action="version", version=f"arranger-server {__version__}")
    add_server_arguments(parser)
    return cmd_server(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
