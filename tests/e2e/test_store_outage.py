"""A server whose PostgreSQL goes away stays up, a standby answering health checks
NOT_SERVING, and takes the lease back when the database returns. A real arranger-server
process and a PostgreSQL server of its own, stopped and started again on its data."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.postgres import PostgresServer, missing

SERVING = health_pb2.HealthCheckResponse.SERVING


def status(address: str) -> int | None:
    """status: the server's health, None when nothing answers."""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=2
            )
        except grpc.RpcError:
            return None
        return int(reply.status)


def until(check: Callable[[], bool], what: str, log: Path, timeout_s: float = 90.0) -> None:
    """until polls `check` until it holds; failing after timeout_s, with the server's log."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            said = log.read_text(errors="replace") if log.exists() else "(no log)"
            raise AssertionError(f"timed out waiting for {what}; the server said:\n{said[-3000:]}")
        time.sleep(0.2)


@pytest.mark.timeout(240)
def test_a_server_whose_database_goes_away_waits_as_a_standby_and_comes_back(
    tmp_path: Path,
) -> None:
    why = missing()
    if why:
        pytest.skip(why)
    database = PostgresServer()
    database.start()
    server: subprocess.Popen[bytes] | None = None
    try:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            address = f"127.0.0.1:{sock.getsockname()[1]}"
        config = tmp_path / "server.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "store": database.new_database(),
                    "insecure": True,
                    "listen": address,
                    "httpListen": "",
                    "dataDir": str(tmp_path / "server"),
                    "leaseSeconds": 2,
                }
            )
        )
        command = [sys.executable, "-m", "arranger.server.main", "--config", str(config)]
        subprocess.run([*command, "--init"], check=True, capture_output=True, timeout=60)
        with (tmp_path / "server.log").open("wb") as log:
            server = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        until(lambda: status(address) == SERVING, "the server to serve", tmp_path / "server.log")
        database.halt()
        until(
            lambda: status(address) == health_pb2.HealthCheckResponse.NOT_SERVING,
            "the server to say it does not serve",
            tmp_path / "server.log",
        )
        assert server.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
        database.resume()
        until(
            lambda: status(address) == SERVING,
            "the server to take the lease back",
            tmp_path / "server.log",
        )
        assert server.poll() is None
        said = (tmp_path / "server.log").read_text()
        assert "the store is unreachable: waiting as a standby" in said, said[-2000:]
    finally:
        if server is not None and server.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)
        database.stop()
