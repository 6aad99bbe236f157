"""web: the server's HTTP port (`httpListen`, 127.0.0.1 unless configured otherwise):
`/metrics` for Prometheus. "" turns the port off.
"""

from __future__ import annotations

import structlog
from aiohttp import web

from arranger.http_endpoint import HttpEndpoint, metrics_handler
from arranger.server.metrics import ServerMetrics

log = structlog.get_logger("arranger.server")


class WebPort:
    """WebPort serves the server's pages from `start()` until `stop()`; `url` once started
    ("" while it is not, or when turned off)."""

    def __init__(self, listen: str, metrics: ServerMetrics) -> None:
        self._endpoint: HttpEndpoint | None = None
        if listen:
            app = web.Application()
            app.router.add_get("/metrics", metrics_handler(metrics.exposition))
            self._endpoint = HttpEndpoint(listen, "httpListen", app)
        self.url = ""

    async def start(self) -> None:
        if self._endpoint is None or self.url:
            return
        await self._endpoint.start()
        self.url = self._endpoint.url
        log.info("http listening", metrics=f"{self.url}/metrics")

    async def stop(self) -> None:
        if self._endpoint is not None and self.url:
            await self._endpoint.stop()
            self.url = ""
