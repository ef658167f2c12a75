"""The health and metrics endpoints: /healthz (alive), /readyz (our socket answers Version),
/metrics (Prometheus). One small aiohttp app, run without its own signal handling (the serve
loop owns SIGTERM)."""

from __future__ import annotations

import logging

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from provider.core.metrics import Metrics
from provider.edge.server import call_version

log = logging.getLogger("secrets_bridge.http")


def build_app(*, socket_path: str, metrics: Metrics) -> web.Application:
    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_request: web.Request) -> web.Response:
        try:
            version = await call_version(socket_path, seconds=2.0)
        except Exception as exc:  # any failure to answer is "not ready"
            log.warning("readiness check failed", extra={"fields": {"error": type(exc).__name__}})
            return web.Response(status=503, text="not ready: the provider socket does not answer\n")
        return web.Response(text=f"ok {version}\n")

    async def metrics_view(_request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_view)
    return app


async def start(app: web.Application, addr: str) -> web.AppRunner:
    host, _, port = addr.rpartition(":")
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host or "0.0.0.0", int(port)).start()  # noqa: S104
    return runner
