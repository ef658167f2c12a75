"""Prometheus metrics of one provider process, on a registry of its own (no global state).

Labels never carry secret material: only backend names, operations, outcomes and gRPC codes.
Besides the provider's own series, the registry carries prometheus-client's process collector
(memory, CPU, open file descriptors: what an operator needs to see a leak on one node) and a
build-info series (the version per node, to see a skew during a rollout).
"""

from __future__ import annotations

import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    generate_latest,
)

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    def __init__(self, version: str = "") -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        Info("secrets_bridge_build", "Version of the provider and its Python", registry=r).info(
            {"version": version or _version(), "python": platform.python_version()}
        )
        self.mount_requests = Counter(
            "secrets_bridge_mount_requests",
            "Mount requests by backend and gRPC code",
            ["backend", "code"],
            registry=r,
        )
        self.mount_duration = Histogram(
            "secrets_bridge_mount_duration_seconds",
            "Mount latency by backend",
            ["backend"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.backend_calls = Counter(
            "secrets_bridge_backend_calls",
            "Calls to a store by backend, operation and outcome",
            ["backend", "operation", "outcome"],
            registry=r,
        )
        self.backend_duration = Histogram(
            "secrets_bridge_backend_call_duration_seconds",
            "Store call latency",
            ["backend", "operation"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        #: Set to a function by the servicer: read when scraped, nothing to count per mount.
        self.mounts_in_flight = Gauge(
            "secrets_bridge_mounts_in_flight",
            "Mount requests being served: parsed and not yet answered (a pile-up while a store "
            "is down or slow)",
            registry=r,
        )
        self.cache_events = Counter(
            "secrets_bridge_cache_events",
            "Cache events (hit, miss, coalesced, evicted) by cache",
            ["cache", "event"],
            registry=r,
        )
        self.class_refresh_reuses = Counter(
            "secrets_bridge_class_refresh_reuses",
            "Values answered from the value cache under a class's own refreshInterval (also "
            "counted as cache hits)",
            registry=r,
        )
        # The change feed, on a node (provider/mount/changes.py, docs/change-feed.md).
        self.feed_healthy = Gauge(
            "secrets_bridge_feed_healthy",
            "1 while the change feed's heartbeat advances (covered values use --feed-window), "
            "0 when values fall back to their configured refresh",
            registry=r,
        )
        self.feed_covered = Gauge(
            "secrets_bridge_feed_covered",
            "Store instances (a Vault address, an AWS region, ...) the change feed covers now",
            registry=r,
        )
        self.feed_changes = Counter(
            "secrets_bridge_feed_changes",
            "Secrets named by the change feed's records",
            registry=r,
        )
        self.feed_dropped = Counter(
            "secrets_bridge_feed_dropped",
            "Cached values and not-founds dropped by the change feed's records",
            registry=r,
        )
        self.feed_resyncs = Counter(
            "secrets_bridge_feed_resyncs",
            "Times a source's values were covered anew after records were missed",
            registry=r,
        )
        self.retries = Counter(
            "secrets_bridge_retries",
            "Retried store calls by backend and reason",
            ["backend", "reason"],
            registry=r,
        )
        self.audit_records = Counter(
            "secrets_bridge_audit_records",
            "Lines written to the audit trail (--audit-log) by event: answered, refused, start, "
            "repeated, dropped",
            ["event"],
            registry=r,
        )
        self.audit_failures = Counter(
            "secrets_bridge_audit_failures",
            "Audit trail writes (a failed write fails the mount) and reopens that failed",
            ["operation"],
            registry=r,
        )
        #: Set to a function by the lifetime table: read when scraped.
        self.credentials_held = Gauge(
            "secrets_bridge_credentials_held",
            "Credentials with a lifetime (leases, certificates) held for polling pods",
            registry=r,
        )
        self.credential_events = Counter(
            "secrets_bridge_credential_events",
            "Credentials with a lifetime by backend and event: issued (a pod's first), reused "
            "(answered again at a poll), renewed, renew_failed, reissued (replaced after its "
            "renewal point), expired, idle (its pod stopped polling), evicted (table full), "
            "unheld (answered but not held: no room without evicting a namespace holding less), "
            "revoked, revoke_refused (an idle, evicted or replaced credential's lease)",
            ["backend", "event"],
            registry=r,
        )
        self.fallback_reads = Counter(
            "secrets_bridge_fallback_reads",
            "Objects read from their fallback store after their store answered not found, by "
            "the primary store's backend and the fallback read's outcome",
            ["backend", "outcome"],
            registry=r,
        )

    def cache_counter(self, cache: str) -> _CacheCounter:
        return _CacheCounter(self, cache)

    @contextmanager
    def backend_call(self, backend: str, operation: str) -> Iterator[None]:
        """Count and time one store call; the outcome is the exception type or "ok"."""
        start = time.perf_counter()
        outcome = "ok"
        try:
            yield
        except BaseException as exc:
            outcome = type(exc).__name__
            raise
        finally:
            self.backend_calls.labels(backend, operation, outcome).inc()
            self.backend_duration.labels(backend, operation).observe(time.perf_counter() - start)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _version() -> str:
    from provider import __version__

    return __version__


class _CacheCounter:
    """Counts one cache's events; label children are looked up once (this is on the path of
    every cached mount)."""

    def __init__(self, metrics: Metrics, cache: str) -> None:
        self._metrics = metrics
        self._cache = cache
        self._children: dict[str, Any] = {}

    def __call__(self, event: str, count: int = 1) -> None:
        child = self._children.get(event)
        if child is None:
            child = self._children[event] = self._metrics.cache_events.labels(self._cache, event)
        child.inc(count)
