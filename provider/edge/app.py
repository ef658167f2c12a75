"""The composition root: settings -> backends, caches, mounter, servicer, HTTP app; and the
`serve` loop with its graceful SIGTERM (stop accepting, drain in-flight mounts within the grace
period, remove the socket, exit 0)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from typing import Any

from backends import registry
from provider.core.caching import ExpiringCache
from provider.core.kube import KubeClient
from provider.core.metrics import Metrics
from provider.core.model import Backend, BackendEnv
from provider.core.settings import CoreSettings, ServeSettings
from provider.core.versions import Versioner
from provider.edge import http
from provider.edge.server import ProviderServicer, build_server
from provider.mount.fetching import Fetcher
from provider.mount.mounting import Mounter

log = logging.getLogger("secrets_bridge")


class Backends:
    """Backends built on first use, so start-up imports no store SDK."""

    def __init__(self, *, core: CoreSettings, options: dict[str, Any], metrics: Metrics) -> None:
        self._core = core
        self._options = options
        self._metrics = metrics
        self._kube = KubeClient(core.kube_api_url)
        self._credentials: ExpiringCache[Any] = ExpiringCache(
            on_event=metrics.cache_counter("credentials")
        )
        self._built: dict[str, Backend] = {}

    def options_for(self, name: str) -> Any:
        return self._options.get(name)

    def get(self, name: str) -> Backend:
        backend = self._built.get(name)
        if backend is None:
            env = BackendEnv(
                name=name,
                core=self._core,
                options=self._options.get(name),
                kube=self._kube,
                metrics=self._metrics,
                credentials=self._credentials,
            )
            backend = self._built[name] = registry.create(env)
        return backend

    async def close(self) -> None:
        for backend in self._built.values():
            with contextlib.suppress(Exception):
                await backend.close()
        await self._kube.close()


def load_versioner(path: str | None) -> Versioner:
    if path:
        return Versioner.from_file(path)
    log.warning(
        "no --hmac-key-file: object versions use a random per-process key and change on "
        "restart, so every pod's files look rotated after a provider restart"
    )
    return Versioner.random()


def build_mounter(settings: ServeSettings, metrics: Metrics) -> tuple[Mounter, Backends]:
    core = settings.core
    backends = Backends(core=core, options=dict(settings.backend_options), metrics=metrics)
    fetcher = Fetcher(
        cache_ttl=core.cache_ttl,
        metrics=metrics,
        serve_stale_max_age=core.serve_stale_max_age,
        max_concurrent_fetches=core.max_concurrent_fetches,
        rate_limits=core.rate_limits,
    )
    mounter = Mounter(
        backend_for=backends.get,
        options_for=backends.options_for,
        fetcher=fetcher,
        versioner=load_versioner(settings.hmac_key_file),
        enable_fake=core.enable_fake_backend,
        max_objects=core.max_objects,
        max_response_bytes=core.max_response_bytes,
    )
    return mounter, backends


def _bind_socket(path: str) -> None:
    """Prepare the socket path: parent directory present, stale socket removed."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


async def serve(
    settings: ServeSettings,
    *,
    ready: asyncio.Event | None = None,
    stop: asyncio.Event | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT (or `stop` is set, for tests and the demo)."""
    metrics = Metrics()
    mounter, backends = build_mounter(settings, metrics)
    servicer = ProviderServicer(mounter=mounter, metrics=metrics)
    server = build_server(servicer, max_send_bytes=settings.core.max_response_bytes + 65536)
    _bind_socket(settings.socket)
    # Only the driver (root on the node) may connect: no world access to the socket.
    old_umask = os.umask(0o117)
    try:
        server.add_insecure_port(f"unix://{settings.socket}")
        await server.start()
    finally:
        os.umask(old_umask)
    runner = await http.start(
        http.build_app(socket_path=settings.socket, metrics=metrics), settings.health_addr
    )
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "serving", extra={"fields": {"socket": settings.socket, "health": settings.health_addr}}
    )
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        log.info("stopping", extra={"fields": {"grace_period": settings.grace_period}})
        # Stop accepting at once; in-flight mounts get the grace period to finish.
        await asyncio.shield(_shutdown(server, runner, backends, settings))
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return 0


async def _shutdown(server: Any, runner: Any, backends: Backends, settings: ServeSettings) -> None:
    await server.stop(settings.grace_period)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(settings.socket)
    await runner.cleanup()
    await backends.close()
    log.info("stopped")
