"""The Helm chart in deploy/helm/secrets-bridge, rendered and linted through helm-python-sdk.

helm-python-sdk binds Helm v4's own Go SDK (no `helm` binary): `Chart.render` is `helm
template` (offline, `lookup` finds nothing), `lint` is `helm lint`, and `Config.render` renders
cluster-aware, calling the API server only for `lookup`. `FakeKubeAPI` is that API server: a
few discovery answers and the Secrets it is given, so the key template's `lookup` path runs
through Helm's real lookup (client-go discovery, then a GET of the Secret) without a cluster.
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import helm_python as helm
import pytest
import yaml

from provider.cli.flags import add_serve_flags
from tests.deploy.conftest import DEPLOY, Rendered

CHART = DEPLOY / "helm" / "secrets-bridge"
RELEASE = "secrets-bridge"
NAMESPACE = "secrets-bridge"
NOTES = f"{RELEASE}/templates/NOTES.txt"

#: Every optional part on, and the image pinned by digest (so CKV_K8S_43 passes outright).
ALL_ON: dict[str, Any] = {
    "image": {"digest": "sha256:" + "0123456789abcdef" * 4},
    "tokenRequestFallback": {"enabled": True},
    "strictParameters": True,
    "networkPolicy": {"enabled": True},
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "secrets"}},
    "cache": {"ttl": 30, "serveStaleMaxAge": 300},
    "rateLimits": {"aws": 40, "azure": 400},
    "allowNodeIdentityNamespaces": ["kube-system"],
    "vault": {"address": "https://vault.example.internal:8200", "caCert": "/etc/ca/ca.crt"},
    "aws": {"region": "eu-west-1"},
    "gcp": {"project": "my-project", "location": "europe-west1", "cluster": "prod"},
    "extraEnv": [{"name": "SECRETS_BRIDGE_MAX_OBJECTS", "value": "200"}],
    "extraVolumes": [{"name": "vault-ca", "configMap": {"name": "vault-ca"}}],
    "extraVolumeMounts": [{"name": "vault-ca", "mountPath": "/etc/ca", "readOnly": True}],
    "podAnnotations": {"example.com/team": "platform"},
}


def serve_parser() -> argparse.ArgumentParser:
    """A parser with exactly the provider's `serve` flags (from the provider's own code)."""
    parser = argparse.ArgumentParser(prog="secrets-bridge serve")
    add_serve_flags(parser)
    return parser


def load() -> helm.Chart:
    return helm.Chart.load(CHART)


def documents(manifests: dict[str, str]) -> Rendered:
    """The rendered templates (NOTES.txt aside) as one multi-document stream."""
    text = "\n---\n".join(
        body for path, body in sorted(manifests.items()) if path != NOTES and body.strip()
    )
    docs = [d for d in yaml.safe_load_all(text) if d]
    return Rendered(text=text, docs=docs)


def render(values: dict[str, Any] | None = None) -> Rendered:
    """`helm template secrets-bridge deploy/helm/secrets-bridge -n secrets-bridge` with values."""
    with load() as chart:
        return documents(chart.render(values or {}, name=RELEASE, namespace=NAMESPACE))


def notes(values: dict[str, Any] | None = None) -> str:
    with load() as chart:
        return chart.render(values or {}, name=RELEASE, namespace=NAMESPACE)[NOTES]


def lint(values: dict[str, Any] | None = None) -> dict[str, Any]:
    """`helm lint --strict` (warnings count as errors) with values."""
    return helm.lint(CHART, values or {}, strict=True, namespace=NAMESPACE)


def refusal(values: dict[str, Any]) -> str:
    """The message a render (an install) with these values fails with; fails if it renders."""
    try:
        render(values)
    except helm.HelmError as exc:
        return str(exc)
    pytest.fail(f"the chart accepted {values!r}")


# --- a stand-in Kubernetes API server for `lookup` ------------------------------------------

_DISCOVERY: dict[str, dict[str, Any]] = {
    "/version": {"major": "1", "minor": "31", "gitVersion": "v1.31.0", "platform": "linux/amd64"},
    "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": []},
    "/api/v1": {
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            {
                "name": "secrets",
                "singularName": "secret",
                "namespaced": True,
                "kind": "Secret",
                "verbs": ["get", "list", "create", "update", "delete"],
            }
        ],
    },
}
_NOT_FOUND = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound"}


class FakeKubeAPI:
    """Discovery plus GET of the Secrets in `secrets` ((namespace, name) -> Secret object)."""

    def __init__(self, secrets: dict[tuple[str, str], dict[str, Any]]) -> None:
        self.secrets = secrets
        self.requests: list[str] = []
        self.url = ""

    def answer(self, path: str) -> tuple[int, dict[str, Any]]:
        self.requests.append(path)
        path = path.split("?", 1)[0]
        if path in _DISCOVERY:
            return 200, _DISCOVERY[path]
        parts = path.strip("/").split("/")
        if len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "secrets":
            secret = self.secrets.get((parts[3], parts[5]))
            if secret is not None:
                return 200, secret
        return 404, {**_NOT_FOUND, "code": 404}

    def render(self, values: dict[str, Any] | None = None, *, upgrade: bool) -> Rendered:
        """Render cluster-aware against this server, as `helm upgrade`/`install` would."""
        config = helm.Config(
            kube_apiserver=self.url,
            kube_token="test-token",
            namespace=NAMESPACE,
            kubeconfig_content="apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n",
        )
        with config, load() as chart:
            manifests = config.render(
                chart,
                values or {},
                name=RELEASE,
                namespace=NAMESPACE,
                is_upgrade=upgrade,
                is_install=not upgrade,
            )
        return documents(manifests)


@contextmanager
def fake_kube_api(secrets: dict[tuple[str, str], dict[str, Any]]) -> Iterator[FakeKubeAPI]:
    api = FakeKubeAPI(secrets)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = api.answer(self.path)
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
