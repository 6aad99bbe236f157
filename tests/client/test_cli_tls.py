"""TLS and connection problems name their real cause in one line, before or instead of blaming
the server, and gRPC's C core prints nothing of its own: the CLI as a real process against a
real TLS server."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from arranger.certs import make_certificates
from arranger.client.dev import DevCluster
from arranger.security import TlsFiles
from arranger.server.app import ArrangerServer
from tests.client.test_cli import arranger
from tests.conftest import FAST


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[str]:
    """tls_server: the address of a server that talks TLS only (certificates in tmp_path/tls;
    another cluster's CA in tmp_path/stranger)."""
    make_certificates(tmp_path / "tls", ["127.0.0.1"], [])
    make_certificates(tmp_path / "stranger", ["127.0.0.1"], [])
    tls = tmp_path / "tls"
    config = dataclasses.replace(
        FAST,
        listen="127.0.0.1:0",
        data_dir=tmp_path / "server",
        tls=TlsFiles(tls / "ca.pem", tls / "server.pem", tls / "server.key"),
    )
    server = ArrangerServer(config)
    await server.start()
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        await server.stop()


async def one_line(*args: str, server: str) -> str:
    rc, _, err = await arranger(*args, server=server)
    assert rc == 1, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


async def test_a_bad_ca_file_is_named_before_connecting(tls_server: str, tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    broken = tmp_path / "broken.pem"
    broken.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    cases = {
        tmp_path / "missing.pem": "No such file or directory",
        junk: "it is not a PEM certificate (one begins -----BEGIN CERTIFICATE-----)",
        tmp_path / "tls" / "server.key": "it holds a private key, not a certificate",
        broken: "its certificate cannot be read",
    }
    for ca, why in cases.items():
        err = await one_line("--ca", str(ca), "list", server=tls_server)
        assert err.startswith(f"error: --ca {ca}: {why}"), err


async def test_the_wrong_ca_is_named_as_such(tls_server: str, tmp_path: Path) -> None:
    stranger = tmp_path / "stranger" / "ca.pem"
    err = await one_line("--ca", str(stranger), "list", server=tls_server)
    assert err == (
        f"error: TLS handshake with {tls_server} failed: the server's certificate is not "
        f"signed by the CA in {stranger}"
    )


@pytest.mark.e2e
async def test_tls_and_plain_mismatches_say_so(
    tls_server: str, cluster: DevCluster, tmp_path: Path
) -> None:
    err = await one_line("list", server=tls_server)
    assert err == (
        f"error: arranger-server at {tls_server} closed the connection at once: it may want "
        "TLS (give its CA with --ca or ARRANGER_CA)"
    )
    ca = tmp_path / "tls" / "ca.pem"
    err = await one_line("--ca", str(ca), "list", server=cluster.address)
    assert err.startswith(
        f"error: TLS handshake with {cluster.address} failed: the server does not speak TLS"
    )
