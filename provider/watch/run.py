"""`secrets-bridge watch`: the change feed's cluster component (docs/change-feed.md).

Two replicas run it; one holds the Lease (provider/watch/lease.py). The holder runs the pulled
sources (a queue, a subscription: acknowledged only after publishing, so a takeover loses
nothing and repeats at most a batch) and writes the heartbeat. A push source (Vault's audit
stream) listens on every replica, and the holder points the audit Service's EndpointSlice at
itself, so Vault's connection reaches the replica that leads; the audit entries Vault had sent
to the one before are lost with its connection, so a new holder starts each push source's
records anew (a new generation: every node covers that source's values anew once).

Nothing here reads a value: the sources see events, the feed carries names. The watcher's own
Kubernetes rights are a Lease, the feed's ConfigMaps and the audit EndpointSlice, in its own
namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from provider.core.changes import Source
from provider.core.errors import BridgeError
from provider.core.kube import KubeClient
from provider.watch.endpoints import point_service
from provider.watch.lease import Elector
from provider.watch.publisher import Publisher

log = logging.getLogger("secrets_bridge.watch")

LEASE_NAME = "secrets-bridge-watch"
AUDIT_SERVICE = "secrets-bridge-watch-audit"


@dataclass(frozen=True)
class SourceSpec:
    """One source as the command line asked: its store package and `create`'s arguments."""

    store: str
    options: Mapping[str, Any]
    #: The port a push source listens on (the audit Service's EndpointSlice), or 0.
    port: int = 0


@dataclass(frozen=True)
class WatchSettings:
    namespace: str
    identity: str
    sources: tuple[SourceSpec, ...]
    heartbeat: float = 30.0
    metrics_address: str = "0.0.0.0:9102"
    kube_api_url: str | None = None
    kube_api_token_file: str = ""
    lease_name: str = LEASE_NAME
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    #: This pod's IP (the downward API's status.podIP), for the audit EndpointSlice.
    pod_ip: str = ""
    audit_service: str = AUDIT_SERVICE


def create_sources(specs: Sequence[SourceSpec]) -> list[Source]:
    """Each source from its store's `changes.create` (loaded here: a store's SDK only when a
    source of it is asked for); ValueError names what a source refuses of its arguments."""
    sources: list[Source] = []
    for spec in specs:
        module = importlib.import_module(f"backends.{spec.store}.changes")
        sources.append(module.create(**spec.options))
    return sources


class WatchMetrics:
    """The watcher's own series (docs/metrics.md), on its --metrics-address."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.leading = Gauge(
            "secrets_bridge_watch_leading",
            "1 while this replica holds the Lease (runs the pulled sources and the heartbeat)",
            registry=self.registry,
        )
        self.source_up = Gauge(
            "secrets_bridge_watch_source_up",
            "1 while the source's event service answers, by source",
            ["source"],
            registry=self.registry,
        )
        self.beat_failures = Gauge(
            "secrets_bridge_watch_beat_failures",
            "Heartbeats in a row this replica could not write",
            registry=self.registry,
        )


class Watcher:
    def __init__(self, settings: WatchSettings, sources: Sequence[Source]) -> None:
        self._settings = settings
        self._sources = list(sources)
        self._client = KubeClient(settings.kube_api_url, token_file=settings.kube_api_token_file)
        self._publisher = Publisher(self._client, settings.namespace, heartbeat=settings.heartbeat)
        self._elector = Elector(
            self._client,
            settings.namespace,
            settings.lease_name,
            settings.identity,
            lease_duration=settings.lease_duration,
            renew_deadline=settings.renew_deadline,
            retry_period=settings.retry_period,
        )
        self.metrics = WatchMetrics()

    async def run(self) -> None:
        """Until cancelled: the push sources on this replica, the rest while leading."""
        async with contextlib.AsyncExitStack() as stack:
            for source in self._sources:
                stack.push_async_callback(source.close)
            stack.push_async_callback(self._client.close)
            pushed = [s for s in self._sources if not s.pulled]
            async with asyncio.TaskGroup() as group:
                for source in pushed:
                    group.create_task(source.run(self._publisher.feed(source)))
                group.create_task(self._elector.run(self._lead))

    async def _lead(self) -> None:
        self.metrics.leading.set(1)
        try:
            for source in self._sources:
                if not source.pulled:
                    await self._retrying(f"a new generation of {source.name}", source)
            await self._point_audit()
            async with asyncio.TaskGroup() as group:
                for source in self._sources:
                    if source.pulled:
                        group.create_task(source.run(self._publisher.feed(source)))
                group.create_task(self._heartbeats())
        finally:
            self.metrics.leading.set(0)

    async def _retrying(self, what: str, source: Source) -> None:
        """A new generation for a push source, tried until it is written (the nodes must not
        keep covering what its lost entries may have changed)."""
        while True:
            try:
                await self._publisher.new_generation(source)
                return
            except BridgeError as exc:
                log.warning("%s failed (%s); trying again", what, exc)
                await asyncio.sleep(self._settings.retry_period)

    async def _point_audit(self) -> None:
        ports = [s.port for s in self._settings.sources if s.port]
        if not ports or not self._settings.pod_ip:
            return
        while True:
            try:
                await point_service(
                    self._client,
                    self._settings.namespace,
                    self._settings.audit_service,
                    self._settings.pod_ip,
                    ports[0],
                    owner=self._settings.lease_name,
                )
                return
            except BridgeError as exc:
                log.warning("pointing %s here failed (%s)", self._settings.audit_service, exc)
                await asyncio.sleep(self._settings.retry_period)

    async def _heartbeats(self) -> None:
        failures = 0
        while True:
            try:
                await self._publisher.beat()
                failures = 0
            except BridgeError as exc:
                failures += 1
                log.warning("heartbeat not written (%s)", exc)
            self.metrics.beat_failures.set(failures)
            for source in self._sources:
                self.metrics.source_up.labels(source.name).set(
                    1 if self._publisher.feed(source).state().up else 0
                )
            await asyncio.sleep(self._settings.heartbeat)


def http_app(watcher: Watcher) -> web.Application:
    """/healthz and /readyz (both replicas: the standby is ready to take over, and a PDB
    counts it), /metrics."""

    async def ok(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(watcher.metrics.registry),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )

    app = web.Application()
    app.router.add_get("/healthz", ok)
    app.router.add_get("/readyz", ok)
    app.router.add_get("/metrics", metrics)
    return app


async def watch(
    settings: WatchSettings,
    *,
    stop: asyncio.Event | None = None,
    sources: Sequence[Source] | None = None,
) -> int:
    """Run until SIGTERM/SIGINT (or, given, until `stop` is set: tests run several in one
    process); the Lease is released on the way out."""
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT) if stop is None else ()
    stop = stop or asyncio.Event()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    watcher = Watcher(settings, create_sources(settings.sources) if sources is None else sources)
    host, _, port = settings.metrics_address.rpartition(":")
    runner = web.AppRunner(http_app(watcher), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host or None, int(port)).start()
    running = asyncio.create_task(watcher.run(), name="watch")
    log.info("watching", extra={"fields": {"identity": settings.identity}})
    try:
        done, _ = await asyncio.wait(
            [running, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED
        )
        if running in done:
            running.result()  # a source or the elector failed for good: say so, exit 1
            return 1
        return 0
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await runner.cleanup()
        for sig in signals:
            loop.remove_signal_handler(sig)
