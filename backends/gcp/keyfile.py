"""A nodePublishSecretRef `key.json`: checked when the pod is identified, signed on the loop.

The key file comes from the pod's namespace, so its `token_uri` is whatever the namespace's
author wrote: google-auth would post the signed assertion there from a worker thread and read
the answer whole, for up to 120 s. So the key is parsed here, `token_uri` must be one of Google's
endpoints or one the provider was configured with, and the JWT-bearer grant (RFC 7523, what
google-auth's service account credentials send) is posted by exchange.py like every other token
call: no thread, a capped body, the Mount's deadline, no redirect.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from yarl import URL

from backends.gcp.exchange import SCOPE
from backends.gcp.options import GOOGLE_TOKEN_URIS, Options
from provider.core.errors import InvalidParameters, scrub

KEY_FILE = "key.json"
#: Lifetime of the signed assertion (google-auth's too).
ASSERTION_LIFETIME = 3600


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
    except ValueError:
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
    """The signed JWT-bearer assertion google-auth would send (RS256 with the key)."""
    from google.auth import crypt
    from google.auth import jwt as google_jwt

    now = int(time.time())
    payload = {
        "iss": key.email,
        "aud": key.token_uri,
        "scope": SCOPE,
        "iat": now,
        "exp": now + ASSERTION_LIFETIME,
    }
    signer = crypt.RSASigner.from_service_account_info(key.info)
    signed: bytes = google_jwt.encode(signer, payload)
    return signed.decode()


def _origin(url: object) -> str:
    try:
        parsed = URL(str(url))
    except ValueError:
        return ""
    if not parsed.is_absolute() or parsed.scheme not in ("https", "http"):
        return ""
    return f"{parsed.scheme}://{(parsed.host or '').lower()}:{parsed.port}"
