"""web: the server's HTTP port (`httpListen`, 127.0.0.1 unless configured otherwise): the
dashboard's pages (see dashboard) and `/metrics` for Prometheus. "" turns the port off.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog
from aiohttp import web

from arranger.http_endpoint import LOOPBACK_HOSTS, HttpEndpoint, metrics_handler
from arranger.server.config import ServerConfig
from arranger.server.dashboard import Dashboard

log = structlog.get_logger("arranger.server")


class WebPort:
    """WebPort serves the dashboard's pages and `exposition` (the metrics) from `start()`
    until `stop()`; `url` once started ("" while it is not, or when turned off)."""

    def __init__(
        self, config: ServerConfig, exposition: Callable[[], bytes], dashboard: Dashboard
    ) -> None:
        self._endpoint: HttpEndpoint | None = None
        self._tls = config.tls is not None
        if config.http_listen:
            app = web.Application(client_max_size=64 * 1024)  # a login form at most
            app.router.add_get("/metrics", metrics_handler(exposition))
            dashboard.add_routes(app)
            self._endpoint = HttpEndpoint(config.http_listen, "httpListen", app)

    @property
    def url(self) -> str:
        return self._endpoint.url if self._endpoint is not None else ""

    async def start(self) -> None:
        if self._endpoint is None or self.url:
            return
        await self._endpoint.start()
        log.info("http listening", dashboard=self.url, metrics=f"{self.url}/metrics")
        if self._tls and self._endpoint.host not in LOOPBACK_HOSTS:
            log.warning(
                "the dashboard's port speaks plain HTTP beyond this machine: tokens typed into "
                "its login page cross the network in clear; keep httpListen on 127.0.0.1 and "
                "reach it through an SSH tunnel or a TLS proxy",
                listen=self.url,
            )

    async def stop(self) -> None:
        if self._endpoint is not None and self.url:
            await self._endpoint.stop()
