"""What a plain (TLS-less) connection carries: no token but the login `arranger dev` left for
exactly that address, and that only to 127.0.0.1. A listener another account holds on a port
a client talks to in clear, or on ::1 where `localhost` may lead, gets none of the user's
tokens; a login an earlier dev run left is refused by the next run."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

from arranger.client.logins import forget_login, read_token_file, write_login
from arranger.client.sdk import ArrangerError, AsyncClient
from arranger.v1 import arranger_pb2, arranger_pb2_grpc
from tests.conftest import running_cluster


class Heard(grpc.aio.ServerInterceptor):
    """Heard: the authorization header of every call a listener was sent."""

    def __init__(self) -> None:
        self.tokens: list[str] = []

    async def intercept_service(self, continuation, details):  # type: ignore[no-untyped-def]
        self.tokens.append(dict(details.invocation_metadata).get("authorization", ""))
        return await continuation(details)


@contextlib.asynccontextmanager
async def listener(host: str) -> AsyncIterator[tuple[int, Heard]]:
    """listener: a stand-in server on `host` (any port) that records what it is sent."""
    heard = Heard()
    server = grpc.aio.server(interceptors=[heard])
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    arranger_pb2_grpc.add_ArrangerServicer_to_server(arranger_pb2_grpc.ArrangerServicer(), server)
    port = server.add_insecure_port(f"{host}:0")
    await server.start()
    try:
        yield port, heard
    finally:
        await server.stop(0)


async def call(address: str) -> None:
    async with AsyncClient(address, timeout_s=5) as client:
        with pytest.raises(ArrangerError):  # the stand-in answers UNIMPLEMENTED
            await client.queues()


async def test_a_plain_connection_carries_only_the_dev_login_of_its_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ARRANGER_TOKEN", "arr_production")
    monkeypatch.delenv("ARRANGER_CA", raising=False)
    async with listener("127.0.0.1") as (port, heard):
        await call(f"127.0.0.1:{port}")
        assert heard.tokens == [""]  # $ARRANGER_TOKEN never goes in clear
        write_login(f"127.0.0.1:{port}", "arr_devlogin")
        try:
            await call(f"127.0.0.1:{port}")
            assert heard.tokens[-1] == "Bearer arr_devlogin"
            await call(f"localhost:{port}")  # another name of the host: no login
            assert heard.tokens[-1] == ""
        finally:
            forget_login(f"127.0.0.1:{port}", "arr_devlogin")


async def test_a_login_on_ipv6_loopback_is_not_the_dev_clusters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    try:
        async with listener("[::1]") as (port, heard):
            write_login(f"127.0.0.1:{port}", "arr_devlogin")  # a dev cluster's, on IPv4
            try:
                await call(f"[::1]:{port}")
                assert heard.tokens == [""]
            finally:
                forget_login(f"127.0.0.1:{port}", "arr_devlogin")
    except RuntimeError as exc:  # grpc: no IPv6 here
        pytest.skip(f"no IPv6 loopback: {exc}")


@pytest.mark.e2e
async def test_a_login_of_an_earlier_run_is_refused(tmp_path: Path) -> None:
    async with running_cluster(tmp_path / "dev") as first:
        stale = first.token
    async with running_cluster(tmp_path / "dev") as again:
        channel = grpc.aio.insecure_channel(again.address)
        async with channel:
            stub = arranger_pb2_grpc.ArrangerStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.ListQueues(
                    arranger_pb2.ListQueuesRequest(),
                    metadata=(("authorization", f"Bearer {stale}"),),
                    timeout=5,
                )
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        async with AsyncClient(again.address, timeout_s=5) as owner:
            await owner.queues()  # the new login, found by address


def test_a_token_file_may_be_a_pipe_or_a_link(tmp_path: Path) -> None:
    read, write = os.pipe()
    os.write(write, b"arr_piped\n")
    os.close(write)
    assert read_token_file(f"/proc/self/fd/{read}") == "arr_piped"
    os.close(read)
    link = tmp_path / "mounted"
    target = tmp_path / "secret"
    target.write_text("arr_mounted\n")
    target.chmod(0o600)
    link.symlink_to(target)  # a mounted secret is often a link
    assert read_token_file(link) == "arr_mounted"
