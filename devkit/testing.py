"""Builders of the provider's inputs, as the composition root and the driver make them.

A BackendEnv and a Pod for calling one backend directly, a FetchContext with a deadline, a
MountRequest as the CSI driver builds it (SPC parameters plus the kubelet's pod keys), the
attributes of a fake-store class, and `Harness`: a Mounter over the fake store built exactly as
`serve` builds it, without gRPC. Tests, the bench's perf scripts and the demo share these so
every layer is fed the same inputs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml

from backends import registry
from backends.fake.options import Options as FakeOptions
from protos import provider_pb2
from provider.cli.mount import kubelet_keys
from provider.core.backend import BackendEnv
from provider.core.caching import ExpiringCache
from provider.core.kube import KubeClient
from provider.core.metrics import Metrics
from provider.core.model import FetchContext, Pod, PodToken
from provider.core.settings import CoreSettings, ServeSettings
from provider.edge.app import build_mounter
from provider.mount.mounting import MountInput


def make_env(name: str, options: Any = None, **core: Any) -> BackendEnv[Any]:
    """A backend's environment as `serve` builds it; `core` are CoreSettings fields. Without
    `options`, the store's defaults (`Options()`), as the composition root passes them."""
    return BackendEnv(
        name=name,
        core=CoreSettings(**core),
        options=options if options is not None else registry.options_class(name)(),
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
    """A deadline `seconds` away; retries stop at a third of it."""
    return FetchContext.within(seconds, time.monotonic())


def driver_request(
    parameters: dict[str, str],
    *,
    tokens: dict[str, str] | None = None,
    namespace: str = "default",
    service_account: str = "app",
    pod: str = "app-0",
    secrets: str = "null",
    permission: str = "420",
    spc: str = "spc",
) -> Any:
    """A MountRequest as the driver builds it: SPC parameters, the kubelet's pod keys, and the
    tokens JSON inside the attributes JSON."""
    attrs = {
        **parameters,
        "secretProviderClass": spc,
        **kubelet_keys(
            pod_name=pod,
            namespace=namespace,
            uid=f"uid-{pod}",
            service_account=service_account,
            tokens=tokens,
        ),
    }
    return provider_pb2.MountRequest(
        attributes=json.dumps(attrs), secrets=secrets, target_path="/t", permission=permission
    )


def attributes(objects: list[dict[str, Any]] | str, **extra: str) -> str:
    """The attributes JSON of a fake-store class mounted by pod default/app-0."""
    attrs = {
        "backend": "fake",
        "objects": objects if isinstance(objects, str) else yaml.safe_dump(objects),
        "secretProviderClass": "spc",
        **kubelet_keys(pod_name="app-0", namespace="default", uid="uid-0", service_account="app"),
    }
    attrs.update(extra)
    return json.dumps(attrs)


def mount_request(attrs: str, secrets: str = "null", permission: str = "420") -> Any:
    """A MountRequest carrying `attrs` as they are (malformed ones included)."""
    return provider_pb2.MountRequest(
        attributes=attrs,
        secrets=secrets,
        target_path="/var/lib/kubelet/pods/x",
        permission=permission,
    )


class Harness:
    """A Mounter over the fake store (a YAML file in `tmp_path`), built as `serve` builds it."""

    def __init__(self, tmp_path: Path, options: dict[str, Any] | None = None, **core: Any) -> None:
        self.store_file = tmp_path / "store.yaml"
        key = tmp_path / "key"
        key.write_bytes(b"k" * 32)
        self.write({"secrets": {}})
        settings = ServeSettings(
            hmac_key_file=str(key),
            core=CoreSettings(enable_fake_backend=True, **core),
            backend_options={
                "fake": FakeOptions(store_file=str(self.store_file)),
                **(options or {}),
            },
        )
        self.metrics = Metrics()
        self.mounter, self.backends = build_mounter(settings, self.metrics)

    def write(self, data: dict[str, Any]) -> None:
        self.store_file.write_text(yaml.safe_dump(data, sort_keys=False))

    @property
    def fake(self) -> Any:
        return self.backends.get("fake")

    def request(self, objects: list[dict[str, Any]], pod: Any = None, **params: str) -> MountInput:
        p = {"backend": "fake", "objects": yaml.safe_dump(objects), **params}
        return MountInput(params=p, pod=pod or make_pod(), permission=0o644)

    async def files(self, objects: list[dict[str, Any]], **params: str) -> dict[str, bytes]:
        result = await self.mounter.mount(self.request(objects, **params))
        return {f.path: f.contents for f in result.files}
