"""The stores a provider serves, each built on first use (so start-up imports no store SDK),
handed to the mounter by the composition root (provider/edge/app.py) at construction: the one
credential cache, byte pool, parse shares and Kubernetes client they share, and their closing.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from backends import registry
from provider.core.backend import AnyBackend, BackendEnv
from provider.core.caching import ExpiringCache
from provider.core.errors import redacted
from provider.core.kube import KubeClient
from provider.core.limits import (
    ANSWER_SLACK,
    PARSE_SHARE,
    PARSE_WINDOW,
    ReadBytes,
    WorkShares,
    namespace_of,
)
from provider.core.metrics import Metrics
from provider.core.settings import CoreSettings

log = logging.getLogger("secrets_bridge")


class Backends:
    """Backends built on first use, so start-up imports no store SDK."""

    def __init__(self, *, core: CoreSettings, options: dict[str, Any], metrics: Metrics) -> None:
        self._core = core
        self._options = options
        self._metrics = metrics
        #: The Kubernetes API (ServiceAccount annotations, TokenRequest, the change feed).
        self.kube = KubeClient(core.kube_api_url, token_file=core.kube_api_token_file)
        # Evicted by namespace share: thousands of throwaway roles in one namespace cannot
        # push another namespace's credentials out (issue 20).
        self._credentials: ExpiringCache[Any] = ExpiringCache(
            on_event=metrics.cache_counter("credentials"), tenant_of=namespace_of
        )
        # One pool for every backend: the node's memory is one, whichever store a mount reads.
        self.reads = ReadBytes(
            core.max_read_bytes,
            core.max_read_bytes_per_namespace,
            core.max_response_bytes + ANSWER_SLACK,
        )
        self.work = WorkShares(PARSE_SHARE, PARSE_WINDOW)
        self._built: dict[str, AnyBackend] = {}
        self._closers: list[tuple[str, Callable[[], Awaitable[None]]]] = []

    def on_close(self, close: Callable[[], Awaitable[None]], name: str) -> None:
        """Run `close` at shutdown before the backends close (the fetcher's loads use them);
        `name` is what a failure to close is logged as."""
        self._closers.append((name, close))

    def options_for(self, name: str) -> Any:
        """The store's Options from the flags, or its defaults when none were parsed."""
        options = self._options.get(name)
        return options if options is not None else registry.options_class(name)()

    def get(self, name: str) -> AnyBackend:
        backend = self._built.get(name)
        if backend is None:
            env = BackendEnv(
                name=name,
                core=self._core,
                options=self.options_for(name),
                kube=self.kube,
                metrics=self._metrics,
                credentials=self._credentials,
                reads=self.reads,
                work=self.work,
            )
            backend = self._built[name] = registry.create(env)
        return backend

    async def close(self) -> None:
        """Close what uses the backends, then each backend, then the Kubernetes client; a
        failure is logged (one line naming what failed to close) and the rest still closed."""
        for name, close in self._closers:
            await released(name, close)
        for name, backend in self._built.items():
            await released(f"the {name} backend", backend.close)
        await released("the Kubernetes client", self.kube.close)


async def released(name: str, release: Callable[[], object]) -> None:
    """Call `release` (and await what it returns, if anything); a failure is logged as one line
    naming `name` (the exception's type, and its text masked of anything that could be a
    secret), not raised, so that what is released after it still is."""
    try:
        result = release()
        if inspect.isawaitable(result):
            await result
    except Exception as exc:
        log.warning(
            "could not release a resource",
            extra={
                "fields": {"resource": name, "error": type(exc).__name__, "detail": redacted(exc)}
            },
        )
