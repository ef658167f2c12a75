"""Which pod a service-account token was issued to, checked against the pod it is passed for.

The kubelet overlays only the keys it sets: with a CSIDriver that requests no tokens, a class
parameter (or a nodePublishSecretRef key) named `csi.storage.k8s.io/serviceAccount.tokens`
reaches us unchanged, so a tenant can pass another namespace's valid token for its own pods.
Every token is therefore read for the claims Kubernetes puts in it — `kubernetes.io.namespace`,
`kubernetes.io.serviceaccount.name` and, for a token bound to a pod, `kubernetes.io.pod.name`
and `.uid`; a legacy Secret-based token has only `sub: system:serviceaccount:<ns>:<name>` —
and refused unless they name the request's kubelet-set pod keys. The signature is not checked
here: the store checks it (a forged token gets no further than the store's login), and the
claims are only compared, never used as the identity. So once a token passes, the identity key
(built from the kubelet's namespace and service account) is exactly what the token proves.

Every Kubernetes service-account token is a JWT: a token in JWT form whose claims cannot be
read, or that names no namespace and service account, is refused as malformed. A string that
is no JWT at all proves no service account to any store we speak to (Vault's jwt and
kubernetes methods, AWS and Google STS, Entra ID all take only a JWT there), so it is left to
the store, which refuses it, as before.
A token the sync controller minted for a SecretSync's service account is bound to no pod: it
names no pod, and only its namespace and service account are compared.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator, Mapping
from typing import Any

from provider.core.errors import InvalidParameters, PermissionDenied
from provider.core.model import Pod, PodToken
from provider.core.parsing import shown

#: A projected token is about 1 KiB; its claims are read only this far.
MAX_TOKEN_BYTES = 64 * 1024
LEGACY_SUBJECT = "system:serviceaccount:"
#: The Pod field a claim is compared with -> the kubelet-set attribute it came from.
ATTRIBUTES = {
    "namespace": "csi.storage.k8s.io/pod.namespace",
    "service_account": "csi.storage.k8s.io/serviceAccount.name",
    "name": "csi.storage.k8s.io/pod.name",
    "uid": "csi.storage.k8s.io/pod.uid",
}
FIX = (
    "pass no tokens in the SecretProviderClass or its nodePublishSecretRef Secret; the kubelet "
    "mints each pod's own when the CSIDriver's spec.tokenRequests lists the audience"
)


def check_bound(pod: Pod, where: str) -> None:
    """Refuse `pod` unless every token it carries was issued to it (`where`: the field that
    carried them, for the message). Never names the token, only its claims."""
    for audience, token in pod.tokens.items():
        if not token.token:
            continue  # no token: pod_token asks for one (or mints it with the fallback)
        for field, claim, value in _claims(token, audience, where):
            if value != getattr(pod, field):
                raise PermissionDenied(
                    f"{where}: the token for audience {shown(audience)} was issued to "
                    f"{claim} {shown(value)}, not to this pod's {ATTRIBUTES[field]} "
                    f"{shown(getattr(pod, field))}; {FIX}"
                )


def _claims(token: PodToken, audience: str, where: str) -> list[tuple[str, str, str]]:
    """(Pod field, claim name, value) for each claim the token carries."""
    what = f"{where}: the token for audience {shown(audience)}"
    if token.token.count(".") != 2:
        return []  # no JWT, so no service account's: the store refuses it
    claims = _payload(token.token)
    if claims is None:
        raise InvalidParameters(
            f"{what} is not a Kubernetes service-account token (a JWT whose claims can be "
            f"read); {FIX}"
        )
    found = list(_kubernetes_claims(claims.get("kubernetes.io")))
    subject = claims.get("sub")
    if isinstance(subject, str) and subject.startswith(LEGACY_SUBJECT):
        namespace, _, name = subject[len(LEGACY_SUBJECT) :].partition(":")
        found += [("namespace", "sub namespace", namespace), ("service_account", "sub name", name)]
    for _, claim, value in found:
        if not isinstance(value, str):
            raise InvalidParameters(f"{what}: its claim {claim} is not a string; {FIX}")
    if not {"namespace", "service_account"} <= {field for field, _, _ in found}:
        raise InvalidParameters(
            f"{what} names no namespace and service account (claims kubernetes.io or sub); {FIX}"
        )
    return found


def _kubernetes_claims(section: Any) -> Iterator[tuple[str, str, Any]]:
    if not isinstance(section, Mapping):
        return
    account, pod = section.get("serviceaccount"), section.get("pod")
    candidates = [("namespace", "kubernetes.io.namespace", section.get("namespace"))]
    if isinstance(account, Mapping):
        name = account.get("name")
        candidates.append(("service_account", "kubernetes.io.serviceaccount.name", name))
    if isinstance(pod, Mapping):
        candidates.append(("name", "kubernetes.io.pod.name", pod.get("name")))
        candidates.append(("uid", "kubernetes.io.pod.uid", pod.get("uid")))
    yield from ((f, c, v) for f, c, v in candidates if v is not None)


def _payload(token: str) -> Mapping[str, Any] | None:
    """A JWS compact token's claims, unverified; None when it is not one."""
    if len(token) > MAX_TOKEN_BYTES:
        return None
    part = token.split(".")[1]
    try:
        raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
        claims = json.loads(raw)
    except (binascii.Error, ValueError, RecursionError):
        return None
    return claims if isinstance(claims, dict) else None
