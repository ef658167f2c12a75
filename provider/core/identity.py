"""Identity helpers shared by backends: the pod's token, the cache scope, node identity.

The kubelet's pod keys are the only trustworthy facts in a Mount (a pod author can override any
SPC parameter through volumeAttributes), so identity is always derived from them and from the
tokens the kubelet minted — never from a token's unverified claims (provider/core/podtokens.py
only compares those claims with the pod keys, and refuses a token issued to another pod).
"""

from __future__ import annotations

from typing import Any

from provider.core.backend import BackendEnv
from provider.core.caching import ExpiringCache
from provider.core.errors import BridgeError, MissingCredential, PermissionDenied, StoreUnavailable
from provider.core.model import Pod

#: Seconds an annotation read from a pod's ServiceAccount is taken as known.
ANNOTATION_TTL = 30.0


def pod_scope(env: BackendEnv[Any], pod: Pod) -> str:
    """The pod's part of every identity key: namespace/serviceaccount, or the pod uid."""
    if env.core.cache_scope == "pod":
        return f"{pod.namespace}/{pod.service_account}/pod:{pod.uid}"
    return f"{pod.namespace}/{pod.service_account}"


def pod_named(pod: Pod) -> str:
    """How refusals name the pod: `namespace/name (service account sa)`, written after "pod".
    `Pod.subject` (namespace/serviceaccount) names the identity a login acts as, not the pod."""
    return f"{pod.namespace}/{pod.name or '<none>'} (service account {pod.service_account})"


async def pod_token(env: BackendEnv[Any], pod: Pod, audience: str) -> str:
    """The pod's token for `audience`, minted via TokenRequest only with the fallback on."""
    token = pod.tokens.get(audience)
    if token is not None and token.token:
        return token.token
    if env.core.token_request_fallback:
        return await env.kube.create_token(
            pod.namespace, pod.service_account, audience, pod.name, pod.uid
        )
    have = ", ".join(repr(a) for a in sorted(pod.tokens)) or "none"
    raise MissingCredential(
        f"no service account token for audience {audience!r} was passed for pod "
        f"{pod_named(pod)} (audiences passed: {have}); add "
        f"{{audience: {audience!r}}} to the CSIDriver's spec.tokenRequests (the driver's Helm "
        f"value tokenRequests), or start the provider with --token-request-fallback (for the "
        f"secrets-store-sync-controller: add {audience!r} to its --token-request-audience)"
    )


def require_node_identity(env: BackendEnv[Any], pod: Pod, what: str) -> None:
    """Refuse node identity unless the pod's namespace is allowed (SECURITY.md, node identity)."""
    if pod.namespace not in env.core.allow_node_identity_namespaces:
        raise PermissionDenied(
            f"{what} uses the node's own identity, which pods in namespace {pod.namespace!r} may "
            f"not use; list the namespace in the provider's --allow-node-identity-namespaces, "
            f"or authenticate as the pod"
        )


class Annotation:
    """One annotation of pods' ServiceAccounts (an IRSA role, a GKE service account), read from
    the Kubernetes API and kept ANNOTATION_TTL seconds per ServiceAccount; "" when absent.
    `instead` names the class parameter that makes the read unnecessary, for the error."""

    def __init__(self, env: BackendEnv[Any], name: str, instead: str) -> None:
        self._env = env
        self._name = name
        self._instead = instead
        self._cache: ExpiringCache[str] = ExpiringCache(max_entries=4096)

    async def of(self, pod: Pod) -> str:
        return (await self.read(pod))[0]

    async def read(self, pod: Pod) -> tuple[str, float]:
        """The annotation, and the `time.monotonic()` at which it is read again (what an
        identity made from it is good until: `Identity.expires`)."""

        async def load() -> tuple[str, float]:
            try:
                annotations = await self._env.kube.service_account_annotations(
                    pod.namespace, pod.service_account
                )
            except BridgeError:
                raise
            except Exception as exc:  # e.g. no in-cluster or kubeconfig configuration
                raise StoreUnavailable(
                    f"cannot read the {self._name} annotation of ServiceAccount "
                    f"{pod.subject} ({type(exc).__name__}); give the provider Kubernetes API "
                    f"access, or set {self._instead}"
                ) from None
            return str(annotations.get(self._name, "")).strip(), ANNOTATION_TTL

        key = (pod.namespace, pod.service_account)
        value = await self._cache.get_or_load(key, load)
        return value, self._cache.expiry(key)
