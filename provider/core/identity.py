"""Identity helpers shared by backends: the pod's token, the cache scope, node identity.

The kubelet's pod keys are the only trustworthy facts in a Mount (a pod author can override any
SPC parameter through volumeAttributes), so identity is always derived from them and from the
tokens the kubelet minted — never from a token's unverified claims.
"""

from __future__ import annotations

from typing import Any

from provider.core.backend import BackendEnv
from provider.core.errors import MissingCredential, PermissionDenied
from provider.core.model import Pod


def pod_scope(env: BackendEnv[Any], pod: Pod) -> str:
    """The pod's part of every identity key: namespace/serviceaccount, or the pod uid."""
    if env.core.cache_scope == "pod":
        return f"{pod.namespace}/{pod.service_account}/pod:{pod.uid}"
    return f"{pod.namespace}/{pod.service_account}"


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
        f"{pod.namespace}/{pod.name} (audiences passed: {have}); add "
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
