"""The driver's MountRequest fields -> a frozen `MountInput` (docs/architecture.md).

`attributes` is a JSON object of strings: SPC parameters overlaid by the volume context. The
kubelet's pod keys identify the pod truthfully; everything else may come from the pod author.
The tokens value is JSON inside a JSON string; `secrets` is `null`, `{}` or a map of strings.
Since the tokens key itself may be a class parameter or a nodePublishSecretRef key (the kubelet
overlays it only when the CSIDriver requests tokens), each token must have been issued to the
request's pod (provider/core/podtokens.py), or the request is refused.

A second caller sends the same shape: the secrets-store-sync-controller (docs/sync-controller.md),
which has no pod and no volume. Its attributes are the class's parameters (no volume overlay, no
`secretProviderClass`, no `ephemeral`), the SecretSync's namespace and `serviceAccountName` as
the identity keys, the controller's OWN pod as pod name and uid (empty when its downward-API env
is unset), and tokens it minted for that service account (600 s, bound to no pod); `secrets` is
`{}`, the target path the placeholder "/mnt/secrets-store". So only the namespace and the service
account are required here; pod name, pod uid, tokens and the target path may be empty, and
nothing below depends on the target path being a kubelet path (tests/mount/test_request_sync.py).

Nesting: the driver's JSON is at most two levels deep (tokens: audience -> entry), but a tenant
may send any depth in the tokens value (a pod attribute) and the request's other fields. The C
JSON decoder gives up at the interpreter's recursion limit (1,000 frames by default, taken from
the same stack as ours) with a RecursionError, quickly even for 4 MiB of `[`; we catch exactly
that around `json.loads` and refuse the field. A depth scan before parsing would state a round
number but costs far more event loop for a hostile request than the decoder's own refusal
(measured: BENCHMARKS.md, "Deeply nested JSON: the decoder's own refusal"; issue 32).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from provider.core.errors import InvalidParameters
from provider.core.model import Pod, PodToken
from provider.core.parsing import shown
from provider.core.podtokens import check_bound

POD_NAME = "csi.storage.k8s.io/pod.name"
POD_NAMESPACE = "csi.storage.k8s.io/pod.namespace"
POD_UID = "csi.storage.k8s.io/pod.uid"
SERVICE_ACCOUNT = "csi.storage.k8s.io/serviceAccount.name"
TOKENS = "csi.storage.k8s.io/serviceAccount.tokens"
DEFAULT_PERMISSION = 0o644

#: A request's four raw fields: attributes, secrets, permission, target path.
Raw = tuple[str, str, str, str]


@dataclass(frozen=True)
class MountInput:
    params: Mapping[str, str]
    pod: Pod
    #: Default file mode from the request's `permission`.
    permission: int
    target_path: str = ""


def parse_request(attributes: str, secrets: str, permission: str, target_path: str) -> MountInput:
    attrs = _json_object(attributes, "attributes")
    not_strings = sorted(k for k, v in attrs.items() if not isinstance(v, str))
    if not_strings:
        raise InvalidParameters(
            f"attributes: every value must be a string; not a string: {', '.join(not_strings)}"
        )
    params: dict[str, str] = attrs  # our own fresh dict: no copy
    publish = _secrets(secrets)
    from_secret = publish.pop(TOKENS, "")  # never kept as a credential of the Secret
    raw_tokens = params.get(TOKENS) or from_secret
    missing = [k for k in (POD_NAMESPACE, SERVICE_ACCOUNT) if not params.get(k)]
    if missing:
        raise InvalidParameters(
            f"attributes: missing {', '.join(missing)}; the kubelet sends these when the "
            "CSIDriver has podInfoOnMount: true"
        )
    pod = Pod(
        namespace=params[POD_NAMESPACE],
        name=params.get(POD_NAME, ""),
        uid=params.get(POD_UID, ""),
        service_account=params[SERVICE_ACCOUNT],
        tokens=_tokens(raw_tokens),
        node_publish_secret=publish,
    )
    # Only the kubelet's pod keys are trustworthy; tokens may be a tenant's parameter.
    check_bound(pod, TOKENS if params.get(TOKENS) else f"secrets: {TOKENS}")
    params.pop(TOKENS, None)
    return MountInput(
        params=params, pod=pod, permission=_permission(permission), target_path=target_path
    )


def _json_object(text: str, field: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidParameters(f"{field}: not valid JSON ({exc.msg} at {exc.pos})") from None
    except RecursionError:
        raise InvalidParameters(
            f"{field}: JSON nested too deeply (the parser's limit is about "
            f"{sys.getrecursionlimit()} levels; the driver's JSON is at most 2 levels deep)"
        ) from None
    if not isinstance(value, dict):
        raise InvalidParameters(f"{field}: expected a JSON object, got {type(value).__name__}")
    return value


def _secrets(text: str) -> dict[str, str]:
    if text.strip() in ("", "null"):
        return {}
    data = _json_object(text, "secrets")
    bad = sorted(k for k, v in data.items() if not isinstance(v, str))
    if bad:
        raise InvalidParameters(
            f"secrets: nodePublishSecretRef values must be strings; not a string: {', '.join(bad)}"
        )
    return dict(data)


def _tokens(raw: str) -> Mapping[str, PodToken]:
    if not raw:
        return {}
    data = _json_object(raw, TOKENS)
    tokens = {}
    for audience, entry in data.items():
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("token"), str)
            or not isinstance(entry.get("expirationTimestamp", ""), str)
        ):
            raise InvalidParameters(
                f"{TOKENS}: the entry for audience {shown(audience)} must be "
                '{"token": "...", "expirationTimestamp": "..."}'
            )
        tokens[audience] = PodToken(entry["token"], entry.get("expirationTimestamp", ""))
    return tokens


def _permission(text: str) -> int:
    if text.strip() == "":
        return DEFAULT_PERMISSION
    if len(text) <= 3 and text.isascii() and text.isdigit() and (text[0] != "0" or text == "0"):
        mode: object = int(text)  # what the driver sends ("420"), without a JSON parse
    else:
        mode = _json_number(text)
    if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o777:
        raise InvalidParameters(
            f'permission: expected a decimal file mode between 0 and 511 (e.g. "420" for '
            f"0644), got {text[:20]!r}"
        )
    return mode


def _json_number(text: str) -> object:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # "[[[…": not a number either
        return None
