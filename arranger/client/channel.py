"""channel makes the client's gRPC channel (plain, or TLS trusting a CA file) and turns a call's
failure into ArrangerError, naming the real cause of a connection that could not be made: a CA
file that is no certificate, a server certificate the CA did not sign, a server that does not
speak TLS, or no server at all.

The CA file is read and checked before any connection is tried, so a wrong file is named as
such rather than blamed on the server. Failover says when a failed call may go to the next
of several servers.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import grpc

from arranger.client.errors import UserFacingError
from arranger.client.logins import dev_login, read_token_file

# Replies as large as the server sends (ListNodes is about 0.4 MiB per 1,000 nodes of 8 GPUs:
# gRPC's default of 4 MiB would refuse it from about 9,500 nodes).
REPLY_LIMIT = [("grpc.max_receive_message_length", 64 * 2**20)]
CONNECT_FAILED = "failed to connect"  # gRPC's words when no connection could be made
PEM_CERTIFICATE = "-----BEGIN CERTIFICATE-----"
HANDSHAKE = ("tls handshake failed", "ssl handshake failed", "handshake failed")
# OpenSSL's words for a certificate chain the trusted CA does not vouch for.
NOT_SIGNED = (
    "certificate_verify_failed",
    "bad_signature",
    "certificate signature failure",
    "unable to get local issuer",
    "self signed certificate",
    "self-signed certificate",
)
NOT_TLS = ("wrong_version_number", "http_request", "packet_length_too_long")


class ArrangerError(UserFacingError):
    """ArrangerError is a refusal or failure of a call: `code` is the gRPC status code."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @classmethod
    def from_rpc(
        cls, exc: grpc.aio.AioRpcError, target: str, ca: str | Path | None = None
    ) -> ArrangerError:
        """from_rpc: the call's failure in one line; one that made no connection names why."""
        code, details = exc.code(), exc.details() or ""
        if code == grpc.StatusCode.UNAVAILABLE and CONNECT_FAILED in details.lower():
            details = unreachable(details, target, ca)
        return cls(code, details or code.name)


def unreachable(details: str, target: str, ca: str | Path | None) -> str:
    """unreachable: why no connection to `target` could be made, from gRPC's `details`, in the
    user's words (the CA file named where TLS is the cause)."""
    text = details.lower()
    if any(h in text for h in HANDSHAKE):
        where = f"TLS handshake with {target} failed"
        if any(n in text for n in NOT_TLS):
            return f"{where}: the server does not speak TLS (without --ca and ARRANGER_CA the client talks plain, as to `arranger dev`)"
        if "expired" in text:
            return f"{where}: the server's certificate (or its CA's) has expired"
        if any(n in text for n in NOT_SIGNED):
            return f"{where}: the server's certificate is not signed by the CA in {ca}"
        if "peer name" in text or "hostname" in text or "subject alternative" in text:
            return f"{where}: the server's certificate does not name {target.rsplit(':', 1)[0]}"
        return f"{where}: {details.rsplit(': ', 1)[-1] or details}"
    if ca is None and "socket closed" in text:
        return (
            f"arranger-server at {target} closed the connection at once: it may want TLS "
            "(give its CA with --ca or ARRANGER_CA)"
        )
    return (
        f"cannot reach arranger-server at {target} (is it running? set --server or ARRANGER_SERVER)"
    )


def read_ca(path: Path) -> bytes:
    """read_ca: the PEM certificates in `path`, checked before they are trusted; a file that is
    missing, unreadable, or holds no certificate OpenSSL can load is an ArrangerError naming
    the file and what is wrong with it."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _bad_ca(path, exc.strerror or str(exc)) from None
    text = data.decode("ascii", errors="replace")
    if PEM_CERTIFICATE not in text:
        if "PRIVATE KEY-----" in text:
            raise _bad_ca(path, "it holds a private key, not a certificate")
        raise _bad_ca(path, f"it is not a PEM certificate (one begins {PEM_CERTIFICATE})")
    import ssl  # noqa: PLC0415 (only a TLS client needs it)

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=text)
    except (ssl.SSLError, ValueError) as exc:
        raise _bad_ca(path, f"its certificate cannot be read ({exc.args[-1]})") from None
    return data


def _bad_ca(path: Path, why: str) -> ArrangerError:
    return ArrangerError(grpc.StatusCode.INVALID_ARGUMENT, f"--ca {path}: {why}")


def make_channel(server: str, token: str | None, ca: str | Path | None) -> grpc.aio.Channel:
    """make_channel: TLS trusting the CA at `ca` (default $ARRANGER_CA) with the bearer token
    on every call (see logins: given, $ARRANGER_TOKEN, $ARRANGER_TOKEN_FILE). Without a CA,
    plain TCP, which carries no token but the login `arranger dev` left for exactly this
    address, and that only to 127.0.0.1: a token sent in clear to a port another account may
    hold would be that account's."""
    ca = ca or os.environ.get("ARRANGER_CA") or None
    if ca is None:
        login = dev_login(server) if server.startswith("127.0.0.1:") else None
        if login:
            from arranger.security import loopback_credentials  # noqa: PLC0415 (a token needs it)

            return grpc.aio.secure_channel(server, loopback_credentials(login), REPLY_LIMIT)
        return grpc.aio.insecure_channel(server, options=REPLY_LIMIT)
    token = token or os.environ.get("ARRANGER_TOKEN") or None
    if token is None and os.environ.get("ARRANGER_TOKEN_FILE"):
        token = read_token_file(os.environ["ARRANGER_TOKEN_FILE"])
    credentials = grpc.ssl_channel_credentials(read_ca(Path(ca)))
    if token:
        from arranger.security import token_credentials  # noqa: PLC0415 (only a token needs it)

        credentials = token_credentials(token, credentials)
    return grpc.aio.secure_channel(server, credentials, options=REPLY_LIMIT)


def ca_of(ca: str | Path | None) -> str | Path | None:
    """ca_of: the CA file a client with `ca` trusts (default $ARRANGER_CA), None for plain."""
    return ca or os.environ.get("ARRANGER_CA") or None


REFUSED = "this server "  # how a server that ran nothing begins its refusal (UNAVAILABLE)


class Failover:
    """Failover: whether a failed call is made again on the next of `count` servers: only one
    that surely did nothing, a connection that could not be made or a server that refused
    before running the call (a standby, one starting or stepping down: its refusals begin
    "this server "), only with more than one server, until `timeout_s`. A call cut off while
    it ran is not (it may have been carried out). After each round of them all it waits a
    little longer (0.1 s, doubling, at most 1 s)."""

    def __init__(self, count: int, timeout_s: float) -> None:
        self.count = count
        self.deadline = time.monotonic() + timeout_s
        self.failed = 0

    async def again(self, exc: grpc.aio.AioRpcError) -> bool:
        if exc.code() != grpc.StatusCode.UNAVAILABLE or self.count < 2:
            return False
        details = exc.details() or ""
        if not (details.startswith(REFUSED) or CONNECT_FAILED in details.lower()):
            return False
        if time.monotonic() >= self.deadline:
            return False
        self.failed += 1
        if self.failed % self.count == 0:
            rounds = self.failed // self.count
            await asyncio.sleep(min(1.0, 0.1 * 2 ** (rounds - 1)))
        return True
