"""The Kubernetes API client against a real HTTPS server: in-cluster configuration (the mounted
service account files, the token re-read as the kubelet rotates it) and status translation."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from devkit.certs import server_tls
from devkit.ports import serve_app
from provider.core import kube
from provider.core.errors import MissingCredential, PermissionDenied, StoreUnavailable
from provider.core.kube import KubeClient


class ApiServer:
    def __init__(self) -> None:
        self.authorizations: list[str] = []
        self.bodies: list[object] = []
        self.status = 200

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/serviceaccounts/{name}", self._get)
        app.router.add_post("/api/v1/namespaces/{ns}/serviceaccounts/{name}/token", self._token)
        return app

    async def _get(self, request: web.Request) -> web.Response:
        self.authorizations.append(request.headers.get("Authorization", ""))
        if self.status != 200:
            return web.json_response({"kind": "Status"}, status=self.status)
        meta = {"name": request.match_info["name"], "annotations": {"a": "b"}}
        return web.json_response({"kind": "ServiceAccount", "metadata": meta})

    async def _token(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.json())
        return web.json_response({"status": {"token": "minted"}}, status=201)


@pytest.fixture
async def in_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[ApiServer, Path]]:
    """An API server reached the way a pod reaches it: service env vars and mounted files."""
    tls = server_tls(tmp_path / "tls", "kubernetes", ips=["127.0.0.1"])
    server = ApiServer()
    runner, port = await serve_app(server.app(), ssl_context=tls.context())
    mounted = tmp_path / "serviceaccount"
    mounted.mkdir()
    (mounted / "ca.crt").write_bytes(tls.ca_file.read_bytes())
    (mounted / "token").write_text("first\n")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(port))
    monkeypatch.setattr(kube, "SERVICE_ACCOUNT_DIR", str(mounted))
    yield server, mounted / "token"
    await runner.cleanup()


async def test_in_cluster_reads_the_mounted_token_and_rereads_it_when_rotated(
    in_cluster: tuple[ApiServer, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, token = in_cluster
    client = KubeClient()
    try:
        assert await client.service_account_annotations("ns", "app") == {"a": "b"}
        token.write_text("second")
        monkeypatch.setattr(kube, "TOKEN_REFRESH", 0.0)
        await client.service_account_annotations("ns", "app")
    finally:
        await client.close()
    assert server.authorizations == ["Bearer first", "Bearer second"]


async def test_token_request_is_bound_to_the_pod(in_cluster: tuple[ApiServer, Path]) -> None:
    server, _ = in_cluster
    client = KubeClient()
    try:
        assert await client.create_token("ns", "app", "vault", "pod-0", "uid-0") == "minted"
    finally:
        await client.close()
    (body,) = server.bodies
    assert body["spec"] == {  # type: ignore[index]
        "audiences": ["vault"],
        "expirationSeconds": 600,
        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "pod-0", "uid": "uid-0"},
    }


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (403, PermissionDenied),
        (401, PermissionDenied),
        (404, MissingCredential),
        (500, StoreUnavailable),
    ],
)
async def test_api_statuses_become_our_errors(
    in_cluster: tuple[ApiServer, Path], status: int, error: type[Exception]
) -> None:
    server, _ = in_cluster
    server.status = status
    client = KubeClient()
    try:
        with pytest.raises(error, match="ServiceAccount ns/app"):
            await client.service_account_annotations("ns", "app")
    finally:
        await client.close()


async def test_an_unreachable_api_is_unavailable() -> None:
    client = KubeClient("http://127.0.0.1:9")
    try:
        with pytest.raises(StoreUnavailable, match="unreachable"):
            await client.service_account_annotations("ns", "app")
    finally:
        await client.close()


async def test_outside_a_cluster_the_kubeconfig_context_is_used(
    in_cluster: tuple[ApiServer, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, token = in_cluster
    port = os.environ["KUBERNETES_SERVICE_PORT"]
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        f"""
apiVersion: v1
kind: Config
current-context: dev
contexts: [{{name: dev, context: {{cluster: dev, user: dev}}}}]
clusters:
- name: dev
  cluster:
    server: https://127.0.0.1:{port}
    certificate-authority: {token.parent / "ca.crt"}
users: [{{name: dev, user: {{token: from-kubeconfig}}}}]
"""
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    client = KubeClient()
    try:
        assert await client.service_account_annotations("ns", "app") == {"a": "b"}
    finally:
        await client.close()
    assert server.authorizations == ["Bearer from-kubeconfig"]
