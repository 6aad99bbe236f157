"""security: who may talk to arranger-server, and how.

Outside `arranger dev` the server serves only over TLS, on two ports. Agents connect to the
agent port and prove who they are with a client certificate signed by the cluster's CA (mutual
TLS; the handshake fails without one), and trust only a server whose certificate that CA
signed. Users connect to the API port and present a bearer token (`authorization: Bearer arr_...`),
issued by `arranger token create` for a user and a role and stored only as its SHA-256 hash
(tokens are 256 random bits: a fast hash loses nothing). Every RPC but health checking and
reflection is refused with UNAUTHENTICATED without them; what a caller may do once known is the
API's to decide (arranger.identity, arranger.server.access). `arranger certs` makes the CA and the certificates of a small
cluster (arranger.certs).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc

from arranger.identity import Principal, set_caller

TOKEN_PREFIX = "arr_"
JOB_TOKEN_PREFIX = "arj_"  # a job's own token (arranger.server.job_tokens)
AGENT_SERVICE = "/arranger.v1.AgentService/"
OPEN_METHODS = (  # answered without credentials: load balancers and grpcurl must see these
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
# gRPC's stubs type method handlers and servicer contexts per message type; here any will do.
Handler = Any
Context = Any


class SecurityError(ValueError):
    """SecurityError: a TLS file or a token that cannot be used, said in one line."""


@dataclass(frozen=True)
class TlsFiles:
    """TlsFiles: the CA certificate to trust, and this party's certificate and key (PEM)."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None

    def read(self) -> tuple[bytes, bytes | None, bytes | None]:
        try:
            ca = self.ca.read_bytes()
            cert = self.cert.read_bytes() if self.cert else None
            key = self.key.read_bytes() if self.key else None
        except OSError as exc:
            raise SecurityError(f"tls: cannot read {exc.filename}: {exc.strerror}") from exc
        return ca, cert, key

    @classmethod
    def from_mapping(cls, raw: Any, base: Path | None, keys: Iterable[str]) -> TlsFiles:
        """from_mapping reads `tls: {ca: F, cert: F, key: F}` (paths relative to `base`);
        `keys` are the ones this party must give."""
        if not isinstance(raw, dict):
            raise SecurityError("tls: must be a mapping with ca, cert and key")
        unknown = set(raw) - {"ca", "cert", "key"}
        if unknown:
            raise SecurityError(f"tls: unknown settings: {', '.join(sorted(unknown))}")
        missing = [k for k in keys if not raw.get(k)]
        if missing:
            raise SecurityError(f"tls: {', '.join(missing)} missing")

        def path(key: str) -> Path | None:
            if not raw.get(key):
                return None
            p = Path(str(raw[key])).expanduser()
            return p if p.is_absolute() or base is None else base / p

        ca = path("ca")
        assert ca is not None
        return cls(ca, path("cert"), path("key"))


def server_credentials(tls: TlsFiles) -> tuple[grpc.ServerCredentials, grpc.ServerCredentials]:
    """server_credentials: for the API port, TLS with our certificate (users show a token);
    for the agent port, mutual TLS: a client certificate the CA signed is required."""
    ca, cert, key = tls.read()
    if cert is None or key is None:
        raise SecurityError("tls: the server needs cert and key")
    api = grpc.ssl_server_credentials([(key, cert)])
    agents = grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=True
    )
    return api, agents


def channel_credentials(tls: TlsFiles) -> grpc.ChannelCredentials:
    """channel_credentials: trust only the CA; present our certificate when we have one."""
    ca, cert, key = tls.read()
    return grpc.ssl_channel_credentials(ca, key, cert)


# Tokens.


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def bearer(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    """bearer: the token of an `authorization: Bearer ...` header ("" if there is none)."""
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode(errors="replace") if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer":
                return token.strip()
    return ""


class TokenAuth(grpc.AuthMetadataPlugin):
    """TokenAuth adds the bearer token to every call of a TLS channel."""

    def __init__(self, token: str) -> None:
        self.token = token

    def __call__(
        self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback
    ) -> None:
        callback((("authorization", f"Bearer {self.token}"),), None)


def token_credentials(token: str, transport: grpc.ChannelCredentials) -> grpc.ChannelCredentials:
    """token_credentials: `transport` with the bearer token on every call."""
    call = grpc.metadata_call_credentials(TokenAuth(token), name="arranger-token")
    return grpc.composite_channel_credentials(transport, call)


def loopback_credentials(token: str) -> grpc.ChannelCredentials:
    """loopback_credentials: plain TCP to 127.0.0.1 that carries the bearer token on every
    call (gRPC's local credentials: the connection is refused unless the server is on this
    machine, so that the token never leaves it in clear). A server without TLS sees a plain
    connection."""
    return token_credentials(
        token, grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP)
    )


Identify = Callable[[str], Awaitable[Principal | None]]


class OpenStreams:
    """OpenStreams counts each user's open server streams (watches, logs) and can end every
    stream a token opened, the moment the token is revoked.

    Each open stream holds an event that is set when its token is revoked."""

    def __init__(self, per_user: int) -> None:
        self.per_user = per_user
        self._users: dict[str, int] = {}
        self._tokens: dict[str, set[asyncio.Event]] = {}
        self._kinds: dict[str, str] = {}  # each token's kind of principal (`token`, `job`)

    def open(self, principal: Principal) -> asyncio.Event | None:
        """open registers a stream of `principal`; None when the user is at the limit."""
        if self._users.get(principal.user, 0) >= self.per_user:
            return None
        self._users[principal.user] = self._users.get(principal.user, 0) + 1
        revoked = asyncio.Event()
        if principal.token:
            self._tokens.setdefault(principal.token, set()).add(revoked)
            self._kinds[principal.token] = principal.kind
        return revoked

    def close(self, principal: Principal, revoked: asyncio.Event) -> None:
        left = self._users.get(principal.user, 0) - 1
        if left > 0:
            self._users[principal.user] = left
        else:
            self._users.pop(principal.user, None)
        streams = self._tokens.get(principal.token)
        if streams is not None:
            streams.discard(revoked)
            if not streams:
                del self._tokens[principal.token]
                del self._kinds[principal.token]

    def open_by(self, user: str) -> int:
        return self._users.get(user, 0)

    def tokens(self, kind: str = "token") -> list[str]:
        """tokens: the hashes of the tokens of this kind of principal that have streams open
        (user tokens by default: the store knows those; a job token is none of them)."""
        return [digest for digest, its in self._kinds.items() if its == kind]

    def revoke(self, digest: str) -> None:
        """revoke ends every stream the token with this hash opened."""
        self._kinds.pop(digest, None)
        for revoked in self._tokens.pop(digest, set()):
            revoked.set()


class Gatekeeper(grpc.aio.ServerInterceptor):
    """Gatekeeper decides who is calling, before any handler runs.

    With TLS, agent calls need a client certificate the CA signed (so they fail on the API
    port, which asks for none) and every other call a bearer token that `identify` turns into a
    principal. Without TLS, a server given an `agent_secret` (arranger dev) asks the same token
    of users and that secret of agents; one with neither (`identify` None: insecure servers)
    takes every caller as `local`.
    Health and reflection are open to all. The handler then runs with its principal as
    `identity.caller()`; a stream it serves counts against its user's open streams and ends
    with UNAUTHENTICATED when its token is revoked. While `closed()` says why (a standby, a
    server starting or stepping down), every call but those open to all is UNAVAILABLE with
    that message, so that clients and agents move on to the active server."""

    def __init__(
        self,
        identify: Identify | None,
        local: Principal,
        streams: OpenStreams,
        closed: Callable[[], str] = lambda: "",
        jobs: JobIdentify | None = None,
        agent_secret: str = "",
    ) -> None:
        self.identify = identify
        self.agent_secret = agent_secret
        self.local = local
        self.streams = streams
        self.closed = closed
        self.jobs = jobs

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        details: grpc.HandlerCallDetails,
    ) -> Handler:
        method: str = details.method
        handler = await continuation(details)
        if handler is None or method.startswith(OPEN_METHODS):
            return handler
        why = self.closed()
        if why:
            return _checked(handler, lambda context: False, why, grpc.StatusCode.UNAVAILABLE)
        token = bearer(details.invocation_metadata)
        if self.jobs is not None and token.startswith(JOB_TOKEN_PREFIX):
            return self._as_job(handler, method, token)
        if self.identify is None:
            if method.startswith(AGENT_SERVICE):
                return handler
            return _as_caller(handler, self.local, self.streams)
        if method.startswith(AGENT_SERVICE):
            if self.agent_secret:
                if hmac.compare_digest(token.encode(), self.agent_secret.encode()):
                    return handler
                return _refusal(handler, "this cluster's agent secret")
            return _checked(handler, _has_client_certificate, "an agent certificate")
        principal = await self.identify(token) if token.startswith(TOKEN_PREFIX) else None
        if principal is None:
            return _refusal(handler, "a valid bearer token (arranger token create; --token-file)")
        return _as_caller(handler, principal, self.streams)

    def _as_job(self, handler: Handler, method: str, token: str) -> Handler:
        """_as_job: the handler run as the job a job token names (on a TLS or an insecure
        server alike), if the token is good and the method one a job may call."""
        assert self.jobs is not None
        principal = self.jobs.identify(token)
        if principal is None:
            return _refusal(handler, "a valid token: this job token's job has ended, or it is none")
        if method not in self.jobs.methods:
            name = method.rpartition("/")[2]
            allowed = ", ".join(sorted(m.rpartition("/")[2] for m in self.jobs.methods))
            message = f"{name}: a job token may call only {allowed}, on its own job"
            return _checked(
                handler, lambda context: False, message, grpc.StatusCode.PERMISSION_DENIED
            )
        return _as_caller(handler, principal, self.streams)


class JobIdentify(Protocol):
    """JobIdentify: who a job token names (None: no live job), and what it may call."""

    methods: frozenset[str]

    def identify(self, token: str) -> Principal | None: ...


def _has_client_certificate(context: Context) -> bool:
    # gRPC puts the peer's verified certificate in the auth context only when it checked it
    # against our CA.
    return bool(context.auth_context().get("x509_common_name"))


# The four kinds of gRPC method: the handler's attribute, its factory, whether replies stream.
HANDLER_KINDS = (
    ("unary_unary", grpc.unary_unary_rpc_method_handler, False),
    ("unary_stream", grpc.unary_stream_rpc_method_handler, True),
    ("stream_unary", grpc.stream_unary_rpc_method_handler, False),
    ("stream_stream", grpc.stream_stream_rpc_method_handler, True),
)


def _checked(
    handler: Handler,
    allowed: Callable[[Context], bool],
    wanted: str,
    code: grpc.StatusCode = grpc.StatusCode.UNAUTHENTICATED,
) -> Handler:
    """_checked wraps a handler so it first checks the caller's context (the request, single
    or streamed, is passed through as it is); a caller refused gets `code` and `wanted`'s
    message."""
    kind, make, streams = next(k for k in HANDLER_KINDS if getattr(handler, k[0]) is not None)
    inner = getattr(handler, kind)
    message = f"this call needs {wanted}" if code == grpc.StatusCode.UNAUTHENTICATED else wanted

    async def check(context: Context) -> None:
        if not allowed(context):
            await context.abort(code, message)

    async def replies(request: Any, context: Context) -> Any:
        await check(context)
        async for reply in inner(request, context):
            yield reply

    async def reply(request: Any, context: Context) -> Any:
        await check(context)
        return await inner(request, context)

    behaviour = replies if streams else reply
    return make(behaviour, handler.request_deserializer, handler.response_serializer)


def _as_caller(handler: Handler, principal: Principal, streams: OpenStreams) -> Handler:
    """_as_caller wraps a handler so it runs as `principal`; a stream of replies is counted
    against the user's open streams and ends when the principal's token is revoked."""
    kind, make, replies_stream = next(
        k for k in HANDLER_KINDS if getattr(handler, k[0]) is not None
    )
    inner = getattr(handler, kind)

    async def reply(request: Any, context: Context) -> Any:
        set_caller(principal)
        return await inner(request, context)

    async def replies(request: Any, context: Context) -> Any:
        set_caller(principal)
        revoked = streams.open(principal)
        if revoked is None:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"open streams: user {principal.user!r} has {streams.per_user} open "
                f"(maxStreamsPerUser {streams.per_user}); end a watch or a log first",
            )
            return
        try:
            async for item in _until(inner(request, context), revoked):
                yield item
            if revoked.is_set():
                await context.abort(
                    grpc.StatusCode.UNAUTHENTICATED, "the token of this stream was revoked"
                )
        finally:
            streams.close(principal, revoked)

    behaviour = replies if replies_stream else reply
    return make(behaviour, handler.request_deserializer, handler.response_serializer)


async def _until(items: AsyncIterator[Any], stop: asyncio.Event) -> AsyncIterator[Any]:
    """_until yields what `items` yields until it ends or `stop` is set; either way, and when
    the caller goes away, `items` is closed and no step of it is left running."""
    stopped = asyncio.ensure_future(stop.wait())
    step: asyncio.Future[Any] | None = None
    try:
        while True:
            step = asyncio.ensure_future(anext(items))
            await asyncio.wait((step, stopped), return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                return
            done, step = step, None
            try:
                item = done.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        stopped.cancel()
        if step is not None:  # stopped, or the caller went away, while a step ran
            step.cancel()
            with contextlib.suppress(BaseException):
                await step
        aclose = getattr(items, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()


def _refusal(handler: Handler, wanted: str) -> Handler:
    return _checked(handler, lambda context: False, wanted)
