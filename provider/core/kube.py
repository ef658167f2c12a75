"""The few Kubernetes API calls the provider makes, through kubernetes_asyncio.

Reads a ServiceAccount's annotations (AWS role ARN, GCP service account) and, only with
`--token-request-fallback`, mints a pod token through the TokenRequest API. The API client is
built on first use, so a provider that never needs the API never loads its configuration.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from provider.core.errors import MissingCredential, PermissionDenied, StoreUnavailable, scrub


class KubeClient:
    def __init__(self, api_url: str | None = None) -> None:
        self._api_url = api_url
        self._client: Any = None
        self._lock = asyncio.Lock()

    async def _core(self) -> Any:
        from kubernetes_asyncio import client, config

        async with self._lock:
            if self._client is None:
                if self._api_url:
                    configuration = client.Configuration(host=self._api_url)
                else:
                    configuration = client.Configuration()
                    try:
                        config.load_incluster_config(client_configuration=configuration)
                    except config.ConfigException:
                        try:
                            await config.load_kube_config(client_configuration=configuration)
                        except (config.ConfigException, OSError) as exc:
                            raise MissingCredential(
                                "the Kubernetes API is not configured: not in a cluster and no "
                                f"kubeconfig ({scrub(exc)}); set --kube-api-url"
                            ) from None
                self._client = client.ApiClient(configuration)
            return client.CoreV1Api(self._client)

    async def service_account_annotations(self, namespace: str, name: str) -> Mapping[str, str]:
        from kubernetes_asyncio.client.exceptions import ApiException

        api = await self._core()
        try:
            sa = await api.read_namespaced_service_account(name, namespace)
        except ApiException as exc:
            raise _translate(exc, f"reading ServiceAccount {namespace}/{name}") from None
        except OSError as exc:
            raise StoreUnavailable(f"Kubernetes API unreachable: {scrub(exc)}") from None
        return dict(sa.metadata.annotations or {})

    async def create_token(
        self, namespace: str, service_account: str, audience: str, pod_name: str, pod_uid: str
    ) -> str:
        """A token bound to the pod, as the kubelet would have minted (TokenRequest API)."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        api = await self._core()
        body = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[audience],
                expiration_seconds=600,
                bound_object_ref=client.V1BoundObjectReference(
                    api_version="v1", kind="Pod", name=pod_name, uid=pod_uid
                ),
            )
        )
        try:
            result = await api.create_namespaced_service_account_token(
                service_account, namespace, body
            )
        except ApiException as exc:
            raise _translate(
                exc, f"creating a token for {namespace}/{service_account} (audience {audience!r})"
            ) from None
        except OSError as exc:
            raise StoreUnavailable(f"Kubernetes API unreachable: {scrub(exc)}") from None
        return str(result.status.token)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def _translate(exc: Any, doing: str) -> Exception:
    status = getattr(exc, "status", 0) or 0
    if status in (401, 403):
        return PermissionDenied(
            f"Kubernetes API refused {doing} (HTTP {status}); check the provider's RBAC"
        )
    if status == 404:
        return MissingCredential(f"{doing}: not found (HTTP 404)")
    return StoreUnavailable(f"Kubernetes API error {doing}: HTTP {status} {scrub(exc.reason)}")
