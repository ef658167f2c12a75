"""Fixtures of the gcp tests: a fake Google on 127.0.0.1 and a backend wired to it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from backends.gcp import dialect as params
from backends.gcp.options import Options
from backends.gcp.store import GcpBackend, create
from devkit.google import POOL, FakeGoogle, start_http, start_secret_manager
from devkit.testing import make_env, make_pod
from provider.core.backend import BackendEnv
from provider.core.model import ParseContext, Pod, StorePlan

PROJECT, LOCATION, CLUSTER = "proj", "europe-west1", "c1"
STS_AUDIENCE = (
    f"identitynamespace:{POOL}:https://container.googleapis.com/v1/projects/{PROJECT}"
    f"/locations/{LOCATION}/clusters/{CLUSTER}"
)


@dataclass
class Stack:
    google: FakeGoogle
    options: Options
    http: str
    env: BackendEnv
    backend: GcpBackend
    #: Backends made by `rebuild`, closed with the stack.
    rebuilt: list[tuple[GcpBackend, BackendEnv]] = field(default_factory=list)

    def pod(self, namespace: str = "default", sa: str = "app", **kw: Any) -> Pod:
        """A pod whose kubelet passed a token for the pool, known to the fake STS."""
        token = f"pod-token-{namespace}-{sa}"
        self.google.pod_tokens[token] = f"{namespace}/{sa}"
        self.google.annotations.setdefault(f"{namespace}/{sa}", {})
        return make_pod(namespace=namespace, service_account=sa, tokens={POOL: token}, **kw)

    def plan(self, parameters: dict[str, str]) -> StorePlan:
        return params.parse(parameters, ParseContext(options=self.options))

    def rebuild(self, core: dict[str, Any] | None = None, **option_changes: Any) -> GcpBackend:
        """Another backend on the same fake Google, with other options or core settings."""
        options = Options(**{**self.options.__dict__, **option_changes})
        env = make_env("gcp", options, kube_api_url=self.http, **(core or {}))
        backend = create(env)
        self.rebuilt.append((backend, env))
        return backend

    async def close(self) -> None:
        for backend, env in [(self.backend, self.env), *self.rebuilt]:
            await backend.close()
            await env.kube.close()


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    google = FakeGoogle(sts_audience=STS_AUDIENCE)
    global_server, global_port = await start_secret_manager(google, "global", regional=False)
    regional_server, regional_port = await start_secret_manager(google, "regional", regional=True)
    runner, http = await start_http(google)
    options = Options(
        project=PROJECT,
        location=LOCATION,
        cluster=CLUSTER,
        sts_endpoint=f"{http}/v1/token",
        iam_endpoint=http,
        secretmanager_endpoint=f"127.0.0.1:{global_port}",
        # No {location} placeholder: one local server stands for every region, and refuses
        # global names (as Google's regional endpoints do), so routing mistakes fail.
        regional_endpoint=f"127.0.0.1:{regional_port}",
        local_channel=True,
    )
    env = make_env("gcp", options, kube_api_url=http)
    backend = create(env)
    stack = Stack(google, options, http, env, backend)
    try:
        yield stack
    finally:
        await stack.close()
        await global_server.stop(None)
        await regional_server.stop(None)
        await runner.cleanup()
