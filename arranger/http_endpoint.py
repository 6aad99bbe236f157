"""http_endpoint: the plain-HTTP port of a daemon (the server's metrics, an agent's metrics).

It runs on the daemon's own event loop (aiohttp), so a handler reads the daemon's state
between two changes, never halfway through one. `listen` is HOST:PORT; port 0 takes any free
port, and `port` tells which once started. Nothing here checks who asks: what it serves is
open, and the default listen address keeps it on the machine.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


class EndpointError(OSError):
    """EndpointError: the address cannot be listened on, said in one line."""


def split_listen(listen: str, key: str) -> tuple[str, int]:
    """split_listen: (host, port) of HOST:PORT, or EndpointError naming the setting `key`."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65_535:
        raise EndpointError(f"{key}: {listen!r} is not HOST:PORT (e.g. 127.0.0.1:9464)")
    return host.strip("[]"), int(port)


def metrics_handler(
    exposition: Callable[[], bytes],
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """metrics_handler answers GET with `exposition()` in Prometheus' text format."""

    async def handle(request: web.Request) -> web.Response:
        response = web.Response(body=exposition())
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    return handle


class HttpEndpoint:
    """HttpEndpoint serves `app` on `listen` from `start()` until `stop()`."""

    def __init__(self, listen: str, key: str, app: web.Application) -> None:
        self.host, self._port = split_listen(listen, key)
        self.key = key
        self.port = 0
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self._port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise EndpointError(
                f"{self.key}: cannot listen on {self.host}:{self._port}: {exc.strerror or exc}"
            ) from exc
        sockets = self._runner.addresses
        self.port = int(sockets[0][1]) if sockets else self._port

    @property
    def url(self) -> str:
        """url: http://HOST:PORT once started, else ""."""
        if not self.port:
            return ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        await self._runner.cleanup()
        self.port = 0
