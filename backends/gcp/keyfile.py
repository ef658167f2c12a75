"""A nodePublishSecretRef `key.json`: checked when the pod is identified, signed on the loop.

The key file comes from the pod's namespace, so its `token_uri` is whatever the namespace's
author wrote: google-auth would post the signed assertion there from a worker thread and read
the answer whole, for up to 120 s. So the key is parsed here, `token_uri` must be one of Google's
endpoints or one the provider was configured with, and the JWT-bearer grant (RFC 7523) is posted
by backends/clouds/gcp.py like every other token call: no thread, a capped body, the Mount's
deadline, no redirect.

The assertion itself is google-auth's own (its service account credentials sign it): its `aud`
is Google's token endpoint by name (`GOOGLE_AUDIENCE`) whatever URL it is posted to, as Google
requires — a private token endpoint (Private Service Connect, a proxy) forwards the assertion to
Google, which refuses any other audience ("Invalid JWT: Failed audience check").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from yarl import URL

from backends.clouds.gcp import SCOPE
from backends.gcp.options import GOOGLE_TOKEN_URIS, Options
from provider.core.errors import InvalidParameters, scrub

KEY_FILE = "key.json"
#: The `aud` of every key assertion: Google's token endpoint by name, wherever it is posted
#: (google-auth's `service_account._GOOGLE_OAUTH2_TOKEN_ENDPOINT`).
GOOGLE_AUDIENCE = "https://oauth2.googleapis.com/token"


@dataclass(frozen=True)
class ServiceAccountKey:
    email: str
    token_uri: str
    info: dict[str, Any] = field(repr=False)


def allowed_token_uris(options: Options | None) -> tuple[frozenset[str], frozenset[str]]:
    """(exact URLs, origins) a key's token_uri may name: Google's, the configured ones, and
    any URL on the origin of the configured STS and IAM endpoints (a private or test Google)."""
    options = options or Options()
    extra = [u.strip() for u in (options.token_uris or "").split(",") if u.strip()]
    origins = frozenset(_origin(u) for u in (options.sts_endpoint, options.iam_endpoint))
    return frozenset((*GOOGLE_TOKEN_URIS, *extra)), origins


def parse_key(key_json: str, options: Options | None) -> ServiceAccountKey:
    """The key's login material, or InvalidParameters naming the field at fault."""
    try:
        info = json.loads(key_json)
    except (ValueError, RecursionError):
        info = None
    if not isinstance(info, dict) or info.get("type") != "service_account":
        raise InvalidParameters(
            f"nodePublishSecretRef {KEY_FILE} must be a Google service account key "
            '(JSON with "type": "service_account")'
        )
    missing = [k for k in ("client_email", "private_key") if not isinstance(info.get(k), str)]
    if missing:
        raise InvalidParameters(f"nodePublishSecretRef {KEY_FILE} has no {', '.join(missing)}")
    token_uri = info.get("token_uri") or GOOGLE_TOKEN_URIS[0]
    exact, origins = allowed_token_uris(options)
    if not isinstance(token_uri, str) or (
        token_uri not in exact and _origin(token_uri) not in origins
    ):
        raise InvalidParameters(
            f"nodePublishSecretRef {KEY_FILE}: token_uri {scrub(token_uri, 120)!r} is not one of "
            f"Google's token endpoints ({', '.join(GOOGLE_TOKEN_URIS)}) nor one the provider "
            "accepts (--gcp-token-uris); the signed key assertion is sent only to those"
        )
    return ServiceAccountKey(str(info["client_email"]), token_uri, info)


def assertion(key: ServiceAccountKey) -> str:
    """The signed JWT-bearer assertion google-auth sends for this key (RS256 with the key;
    `aud` is Google's token endpoint, `GOOGLE_AUDIENCE`, not the `token_uri` it is posted to).
    Blocking (loading the RSA key costs CPU): run it off the event loop."""
    from google.oauth2 import service_account

    # google-auth's own credentials build and sign the assertion (the claims it sends when it
    # refreshes them itself); only the POST is ours (backends/clouds/gcp.py), to the allowed
    # token_uri.
    credentials = service_account.Credentials.from_service_account_info(
        {**key.info, "token_uri": key.token_uri}, scopes=[SCOPE]
    )
    signed: bytes | str = credentials._make_authorization_grant_assertion()
    return signed.decode() if isinstance(signed, bytes) else signed


def _origin(url: object) -> str:
    try:
        parsed = URL(str(url))
    except ValueError:
        return ""
    if not parsed.is_absolute() or parsed.scheme not in ("https", "http"):
        return ""
    return f"{parsed.scheme}://{(parsed.host or '').lower()}:{parsed.port}"
