"""postgres: a real PostgreSQL server for the tests, started once per test run.

Debian's `postgresql` package (installed by .ci/run) gives initdb and postgres. As root (CI) the
server runs as the `postgres` account, since PostgreSQL refuses to run as root; otherwise as
the user running the tests. It listens on 127.0.0.1 at a free port and on a socket in its own
temporary directory, trusts local connections (nothing beyond this machine reaches it), and
keeps no data after the run: fsync is off, the directory is removed when it stops. Each test
gets a database of its own.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 60.0
_databases = itertools.count()
SERVERS: set[int] = set()  # pids of servers that outlive a test (they stop with the run)


def binaries() -> Path | None:
    """binaries: the directory of initdb and postgres, None where PostgreSQL is not installed."""
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(candidate) / "initdb").exists():
            return Path(candidate)
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def missing() -> str:
    """missing: why a PostgreSQL server cannot be started here ("" if it can)."""
    if binaries() is None:
        return "PostgreSQL is not installed (Debian: apt-get install postgresql; .ci/run does)"
    try:
        import psycopg  # noqa: F401, PLC0415
    except ImportError:
        return "psycopg is not installed (pip install 'arranger[postgres]')"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root with no postgres account to run the server as"
    return ""


class PostgresServer:
    """PostgresServer: one postgres process in a temporary directory, until `stop`."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="arranger-pg-"))
        self.port = _free_port()
        self._process: subprocess.Popen[bytes] | None = None

    def _owner(self) -> dict[str, Any]:
        """How subprocess runs the server's programs: as `postgres` under root."""
        if os.geteuid() != 0:
            return {}
        account = pwd.getpwnam("postgres")
        return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}

    def start(self) -> None:
        bindir = binaries()
        assert bindir is not None
        owner = self._owner()
        data = self.root / "data"
        if owner:
            os.chown(self.root, owner["user"], owner["group"])
        os.chmod(self.root, 0o700)
        initdb = [
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale",
            "C",
        ]
        subprocess.run(initdb, check=True, capture_output=True, cwd=self.root, **owner)
        self._run()

    def _run(self) -> None:
        """_run starts postgres on the data directory made by start, and waits for it."""
        bindir = binaries()
        assert bindir is not None
        owner = self._owner()
        data = self.root / "data"
        server = [
            str(bindir / "postgres"),
            "-D",
            str(data),
            "-p",
            str(self.port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"unix_socket_directories={self.root}",
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
            "-c",
            "max_connections=300",
            "-c",
            "shared_buffers=32MB",
        ]
        log = open(self.root / "server.log", "wb")  # noqa: SIM115 (the server's, until it stops)
        self._process = subprocess.Popen(
            server,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.root,
            start_new_session=True,
            **owner,
        )
        log.close()
        SERVERS.add(self._process.pid)
        self._wait_ready()

    def _wait_ready(self) -> None:
        import psycopg  # noqa: PLC0415

        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(f"postgres exited: {self.log_tail()}")
            try:
                psycopg.connect(self.url("postgres"), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"postgres did not start: {self.log_tail()}") from None
                time.sleep(0.05)

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "server.log").read_text(errors="replace")[-2000:]
        return ""

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """new_database makes an empty database; returns its URL."""
        import psycopg  # noqa: PLC0415

        name = f"t{os.getpid()}_{next(_databases)}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as db:
            db.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def halt(self) -> None:
        """halt stops postgres and keeps its data: clients find nothing there until resume."""
        self._halt()

    def resume(self) -> None:
        """resume starts postgres again on its data and port."""
        self._run()

    def stop(self) -> None:
        self._halt()
        shutil.rmtree(self.root, ignore_errors=True)

    def _halt(self) -> None:
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGINT)  # fast shutdown
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait()
            SERVERS.discard(self._process.pid)


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
