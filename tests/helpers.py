"""Builders shared by tests: a BackendEnv and a Pod, as the composition root would make them."""

from __future__ import annotations

import time
from typing import Any

from backends.base import BackendEnv, FetchContext, Pod, PodToken
from provider.caching import ExpiringCache
from provider.kube import KubeClient
from provider.metrics import Metrics
from provider.settings import CoreSettings


def make_env(name: str, options: Any = None, **core: Any) -> BackendEnv:
    return BackendEnv(
        name=name,
        core=CoreSettings(**core),
        options=options,
        kube=KubeClient(core.get("kube_api_url")),
        metrics=Metrics(),
        credentials=ExpiringCache(),
    )


def make_pod(
    namespace: str = "default",
    service_account: str = "app",
    name: str = "app-0",
    uid: str = "uid-0",
    tokens: dict[str, str] | None = None,
    secrets: dict[str, str] | None = None,
) -> Pod:
    return Pod(
        namespace=namespace,
        name=name,
        uid=uid,
        service_account=service_account,
        tokens={aud: PodToken(tok) for aud, tok in (tokens or {}).items()},
        node_publish_secret=secrets or {},
    )


def fetch_ctx(seconds: float = 30.0) -> FetchContext:
    now = time.monotonic()
    return FetchContext(deadline=now + seconds, retry_deadline=now + seconds / 3)
