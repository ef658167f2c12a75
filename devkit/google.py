"""A wire-level stand-in for Google: Secret Manager over gRPC, STS, IAM credentials, OAuth and
the Kubernetes ServiceAccount read, on 127.0.0.1.

No emulator of Secret Manager exists, so this one speaks its real protocol with the client
library's own message types. Every call is authorised by the bearer token it carries: tokens are
issued by the fake STS/IAM/OAuth endpoints to a principal, and secrets list the principals that
may read them — so a test that serves one identity another's value fails at the wire.
ListSecrets and ListSecretVersions (a selector's listings) page, filter (`name:` a substring,
`labels.k=v`, `state:ENABLED`) and check the caller's roles/secretmanager.viewer as Google does.

The OAuth endpoint checks a service account key's JWT-bearer assertion as Google does, wherever
it is served (a private token endpoint forwards to Google): the grant type, `aud` exactly
Google's token endpoint, a lifetime of at most an hour around now, a scope, and — for a key
registered with `add_key` — the RS256 signature; each refusal is Google's `invalid_grant` (or
`unsupported_grant_type`, `invalid_scope`) answer with status 400.

IAM credentials `signJwt` signs a payload with a real RSA key of the service account (made on
first use, kept in `signing_keys`) for a caller holding roles/iam.serviceAccountTokenCreator on it
(`signers`); the public halves are published as Google publishes them
(`/service_accounts/v1/metadata/x509/<email>`: key id -> certificate PEM, and
`/service_accounts/v1/jwk/<email>`: a JWKS), and IAM's `serviceAccounts.get` answers the
accounts registered with `add_service_account` (email, uniqueId, projectId).
"""

from __future__ import annotations

import datetime
import json
import re
import secrets
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
import jwt
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from google.cloud.secretmanager_v1.types import resources, service

from devkit.ports import serve_app

SERVICE = "google.cloud.secretmanager.v1.SecretManagerService"
POOL = "proj.svc.id.goog"
#: The only `aud` Google accepts in a service account key's assertion, at any token endpoint.
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
#: Google's refusals of a JWT-bearer assertion (error_description of an `invalid_grant`).
BAD_SIGNATURE = "Invalid JWT Signature."
BAD_AUDIENCE = f"Invalid JWT: Failed audience check. The right audience is {GOOGLE_TOKEN_AUDIENCE}"
BAD_TIMES = (
    "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. "
    "Check your iat and exp values in the JWT claim."
)


@dataclass
class FakeGoogle:
    #: "projects/p/secrets/s" (or with locations/l) -> payloads of versions 1..N.
    secrets: dict[str, list[bytes]] = field(default_factory=dict)
    #: secret -> principals allowed to access it.
    readers: dict[str, set[str]] = field(default_factory=dict)
    #: pod token -> "namespace/serviceaccount" (what the kubelet minted it for).
    pod_tokens: dict[str, str] = field(default_factory=dict)
    #: the audience STS expects.
    sts_audience: str = ""
    #: "namespace/name" -> ServiceAccount annotations.
    annotations: dict[str, dict[str, str]] = field(default_factory=dict)
    #: Google service account -> principals allowed to impersonate it.
    impersonators: dict[str, set[str]] = field(default_factory=dict)
    #: issued access token -> principal.
    tokens: dict[str, str] = field(default_factory=dict)
    #: Lifetime of issued tokens (seconds).
    lifetime: int = 3600
    #: resource name -> list of status codes to answer before serving it.
    failures: dict[str, list[grpc.StatusCode]] = field(default_factory=dict)
    #: HTTP status codes the next STS calls answer with (then normal service).
    sts_failures: list[int] = field(default_factory=list)
    sts_requests: list[dict[str, str]] = field(default_factory=list)
    iam_requests: list[dict[str, Any]] = field(default_factory=list)
    oauth_requests: list[dict[str, str]] = field(default_factory=list)
    #: The URL each OAuth request was posted to (beside `oauth_requests`).
    oauth_urls: list[str] = field(default_factory=list)
    #: (server label, resource name, principal) per AccessSecretVersion or
    #: RenderParameterVersion (devkit/google_params.py).
    reads: list[tuple[str, str, str]] = field(default_factory=list)
    #: "projects/p/locations/l/parameters/x" -> version id -> payload (insertion order: the
    #: last one is `latest`); readers in `readers`, keyed by the parameter.
    parameters: dict[str, dict[str, bytes]] = field(default_factory=dict)
    #: service account email -> key id -> public key PEM: assertions of a listed account must
    #: carry one of its key ids and that key's signature (others are not checked).
    keys: dict[str, dict[str, bytes]] = field(default_factory=dict)
    #: The claims of each key assertion the OAuth endpoint accepted.
    assertions: list[dict[str, Any]] = field(default_factory=list)
    #: secret -> its labels (ListSecrets answers and filters them).
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    #: Version names ("<secret>/versions/<n>") disabled: not accessible, not `state:ENABLED`.
    disabled: set[str] = field(default_factory=set)
    #: "projects/p" or a secret -> principals with roles/secretmanager.viewer there (list
    #: secrets, list versions). `readers` keyed by "projects/p" grant access to every secret of
    #: the project: a missing secret is then NOT_FOUND, as Google answers such a principal.
    viewers: dict[str, set[str]] = field(default_factory=dict)
    #: (method, parent, principal) per ListSecrets or ListSecretVersions call.
    listings: list[tuple[str, str, str]] = field(default_factory=list)
    #: A hostile store: ListSecrets answers empty pages, each with a next page token, forever.
    endless_pages: bool = False
    #: Google service account -> principals allowed to signJwt as it (TokenCreator).
    signers: dict[str, set[str]] = field(default_factory=dict)
    #: Google service account -> (key id, private key) that signJwt signs with.
    signing_keys: dict[str, tuple[str, rsa.RSAPrivateKey]] = field(default_factory=dict)
    #: The payload of each JWT signJwt signed.
    signed_payloads: list[dict[str, Any]] = field(default_factory=list)
    #: Registered service accounts: email -> (uniqueId, projectId), for serviceAccounts.get.
    service_accounts: dict[str, tuple[str, str]] = field(default_factory=dict)

    def add_version(self, secret: str, payload: bytes | str, *readers: str) -> str:
        data = payload.encode() if isinstance(payload, str) else payload
        self.secrets.setdefault(secret, []).append(data)
        self.readers.setdefault(secret, set()).update(readers)
        return f"{secret}/versions/{len(self.secrets[secret])}"

    def add_secret(
        self, secret: str, payload: bytes | str, *readers: str, labels: dict[str, str] | None = None
    ) -> str:
        """A secret with labels and a first version (or one more version)."""
        self.labels[secret] = dict(labels or {})
        return self.add_version(secret, payload, *readers)

    def delete_secret(self, secret: str) -> None:
        self.secrets.pop(secret, None)
        self.labels.pop(secret, None)
        self.readers.pop(secret, None)  # its IAM policy goes with it

    def may_read(self, principal: str, secret: str) -> bool:
        """Access to the secret's versions: granted on the secret or on its project."""
        return principal in self.readers.get(secret, set()) | self.readers.get(
            project(secret), set()
        )

    def add_parameter_version(
        self, parameter: str, version: str, payload: bytes | str, *readers: str
    ) -> str:
        """A Parameter Manager version; `__REF__("//secretmanager.googleapis.com/<secret
        version>")` in the payload is rendered from `secrets`."""
        data = payload.encode() if isinstance(payload, str) else payload
        self.parameters.setdefault(parameter, {})[version] = data
        self.readers.setdefault(parameter, set()).update(readers)
        return f"{parameter}/versions/{version}"

    def add_key(self, email: str, key_id: str, public_pem: bytes) -> None:
        """Register a service account key: its assertions are then signature-checked."""
        self.keys.setdefault(email, {})[key_id] = public_pem

    def check_assertion(self, form: Mapping[str, str]) -> tuple[str, str] | dict[str, Any]:
        """Google's checks of a JWT-bearer grant: the claims, or (error, error_description)."""
        if form.get("grant_type") != JWT_BEARER:
            return "unsupported_grant_type", f"Invalid grant_type: {form.get('grant_type', '')}"
        token = form.get("assertion", "")
        try:
            header = jwt.get_unverified_header(token)
            claims: dict[str, Any] = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            return "invalid_grant", BAD_SIGNATURE
        if header.get("alg") != "RS256" or not isinstance(claims.get("iss"), str):
            return "invalid_grant", BAD_SIGNATURE
        registered = self.keys.get(claims["iss"])
        if registered is not None:
            public = registered.get(str(header.get("kid", "")))
            try:
                if public is None:
                    raise jwt.InvalidSignatureError("unknown key id")
                jwt.decode(
                    token,
                    public,
                    algorithms=["RS256"],
                    options={"verify_aud": False, "verify_exp": False, "verify_iat": False},
                )
            except jwt.PyJWTError:
                return "invalid_grant", BAD_SIGNATURE
        if claims.get("aud") != GOOGLE_TOKEN_AUDIENCE:
            return "invalid_grant", BAD_AUDIENCE
        iat, exp, now = claims.get("iat"), claims.get("exp"), time.time()
        if (
            not isinstance(iat, int)
            or not isinstance(exp, int)
            or not iat < exp <= iat + 3600
            or iat > now + 300
            or exp < now - 300
        ):
            return "invalid_grant", BAD_TIMES
        if not claims.get("scope"):
            return "invalid_scope", "Invalid OAuth scope or ID token audience provided."
        return claims

    def add_service_account(self, email: str, project_id: str = "proj") -> str:
        """A service account serviceAccounts.get knows; returns its uniqueId."""
        unique_id = str(100000000000000000000 + len(self.service_accounts))
        self.service_accounts[email] = (unique_id, project_id)
        return unique_id

    def signing_key(self, email: str) -> tuple[str, rsa.RSAPrivateKey]:
        """The service account's system-managed key signJwt signs with (made on first use)."""
        if email not in self.signing_keys:
            private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            self.signing_keys[email] = (secrets.token_hex(20), private)
        return self.signing_keys[email]

    def sign_jwt(self, email: str, payload: str) -> tuple[str, str]:
        """signJwt: the payload (a JSON object) signed RS256 with the account's key."""
        claims = json.loads(payload)
        if not isinstance(claims, dict):
            raise ValueError("payload")
        kid, private = self.signing_key(email)
        self.signed_payloads.append(claims)
        return kid, jwt.encode(claims, private, algorithm="RS256", headers={"kid": kid})

    def x509_keys(self, email: str) -> dict[str, str]:
        """Google's x509 endpoint of a service account: key id -> self-signed certificate."""
        if email not in self.signing_keys:
            return {}
        kid, private = self.signing_keys[email]
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, email)])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(private.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .sign(private, hashes.SHA256())
        )
        return {kid: cert.public_bytes(serialization.Encoding.PEM).decode()}

    def jwks(self, email: str) -> dict[str, Any]:
        keys = []
        for kid, private in [self.signing_keys[email]] if email in self.signing_keys else []:
            jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private.public_key()))
            keys.append({**jwk, "kid": kid, "alg": "RS256", "use": "sig"})
        return {"keys": keys}

    def issue(self, principal: str) -> str:
        token = "ya29.fake-" + secrets.token_hex(12)
        self.tokens[token] = principal
        return token

    def revoke_all(self) -> None:
        self.tokens.clear()


def project(name: str) -> str:
    """ "projects/p" of any resource name under it."""
    return "/".join(name.split("/")[:2])


async def authorise(google: FakeGoogle, context: grpc.aio.ServicerContext, name: str) -> str:
    """Check the call's bearer token as Google does and play any failure queued for `name`;
    the caller's principal ("namespace/serviceaccount" or a GSA)."""
    metadata = dict(context.invocation_metadata() or ())
    auth = str(metadata.get("authorization", ""))
    principal = google.tokens.get(auth.removeprefix("Bearer "))
    if not auth.startswith("Bearer ") or principal is None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "Request had invalid credentials.")
    assert principal is not None
    queued = google.failures.get(name)
    if queued:
        await context.abort(queued.pop(0), f"injected failure for {name}")
    return principal


async def admit(
    google: FakeGoogle, context: grpc.aio.ServicerContext, label: str, name: str
) -> str:
    """`authorise`, and record the read."""
    metadata = dict(context.invocation_metadata() or ())
    principal = google.tokens.get(str(metadata.get("authorization", "")).removeprefix("Bearer "))
    if principal is not None:
        google.reads.append((label, name, principal))
    return await authorise(google, context, name)


# -- Secret Manager (gRPC) ----------------------------------------------------------------------


def secret_manager_handler(google: FakeGoogle, label: str, regional: bool) -> Any:
    async def access(
        request: service.AccessSecretVersionRequest, context: grpc.aio.ServicerContext
    ) -> service.AccessSecretVersionResponse:
        name = request.name
        principal = await admit(google, context, label, name)
        secret, _, version = name.rpartition("/versions/")
        if ("/locations/" in secret) != regional:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"{name} is not served by this endpoint"
            )
        versions = google.secrets.get(secret)
        if not google.may_read(principal, secret):
            # Like Google: without access, a missing secret is indistinguishable from a denied one.
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"Permission 'secretmanager.versions.access' denied for resource '{name}' "
                "(or it may not exist).",
            )
        if versions is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Secret [{secret}] not found.")
        assert versions is not None
        number = len(versions) if version == "latest" else int(version)
        if not 1 <= number <= len(versions):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Secret Version [{name}] not found.")
        if f"{secret}/versions/{number}" in google.disabled:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"Secret Version [{secret}/versions/{number}] is in DISABLED state.",
            )
        return service.AccessSecretVersionResponse(
            name=f"{secret}/versions/{number}",
            payload=resources.SecretPayload(data=versions[number - 1]),
        )

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "AccessSecretVersion": grpc.unary_unary_rpc_method_handler(
                access,
                request_deserializer=service.AccessSecretVersionRequest.deserialize,
                response_serializer=service.AccessSecretVersionResponse.serialize,
            ),
            **listing_handlers(google, regional),
        },
    )


# -- ListSecrets and ListSecretVersions ----------------------------------------------------------

#: The terms of Google's list filter this fake reads, joined by AND: `name:<substring>` (a
#: substring of the whole resource name, not a prefix), `labels.<k>=<v>`, `labels.<k>:*`,
#: `state:<STATE>`; anything else is INVALID_ARGUMENT, as an unknown field is at Google.
_TERM = re.compile(
    r"name:(?P<name>\S+)|labels\.(?P<key>[\w-]+)(?:=(?P<value>\S*)|(?P<any>:\*))"
    r"|state:(?P<state>ENABLED|DISABLED|DESTROYED)"
)
#: Google's largest page, and the one it picks when a request names none.
MAX_PAGE = 25_000


def matches(filter_text: str, name: str, labels: dict[str, str], state: str = "") -> bool:
    """Whether a secret (or a version, with its state) passes a list filter; ValueError for a
    filter this fake does not read."""
    for term in filter(None, filter_text.split(" AND ")):
        match = _TERM.fullmatch(term.strip())
        if match is None:
            raise ValueError(term)
        if match["name"] is not None and match["name"].strip('"') not in name:
            return False
        if match["key"] is not None:
            if match["any"] and match["key"] not in labels:
                return False
            if not match["any"] and labels.get(match["key"]) != match["value"].strip('"'):
                return False
        if match["state"] is not None and match["state"] != state:
            return False
    return True


def paged(items: list[Any], size: int, token: str) -> tuple[list[Any], str]:
    """One page of `items` from `token` (an offset), and the next page's token."""
    start = int(token) if token else 0
    end = start + (size or MAX_PAGE)
    return items[start:end], str(end) if end < len(items) else ""


def listing_handlers(google: FakeGoogle, regional: bool) -> dict[str, Any]:
    async def check(context: grpc.aio.ServicerContext, method: str, request: Any) -> str:
        metadata = dict(context.invocation_metadata() or ())
        caller = str(metadata.get("authorization", "")).removeprefix("Bearer ")
        google.listings.append((method, request.parent, google.tokens.get(caller, "")))
        principal = await authorise(google, context, request.parent)
        if ("/locations/" in request.parent) != regional:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"{request.parent} is not served here"
            )
        if not 0 <= request.page_size <= MAX_PAGE or not re.fullmatch(r"\d*", request.page_token):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "invalid page size or token")
        return principal

    async def list_secrets(
        request: service.ListSecretsRequest, context: grpc.aio.ServicerContext
    ) -> service.ListSecretsResponse:
        principal = await check(context, "ListSecrets", request)
        parent = request.parent
        if not re.fullmatch(r"projects/[^/]+(/locations/[^/]+)?", parent):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid parent [{parent}]")
        if principal not in google.viewers.get(project(parent), set()):
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"Permission 'secretmanager.secrets.list' denied for resource '{parent}' "
                "(or it may not exist).",
            )
        if google.endless_pages:
            return service.ListSecretsResponse(next_page_token=str(len(google.listings)))
        try:
            names = sorted(
                n
                for n in google.secrets
                if n.rpartition("/secrets/")[0] == parent
                and matches(request.filter, n, google.labels.get(n, {}))
            )
        except ValueError as bad:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid filter: {bad}")
            raise
        page, token = paged(names, request.page_size, request.page_token)
        secrets_ = [resources.Secret(name=n, labels=google.labels.get(n, {})) for n in page]
        return service.ListSecretsResponse(secrets=secrets_, next_page_token=token)

    async def list_versions(
        request: service.ListSecretVersionsRequest, context: grpc.aio.ServicerContext
    ) -> service.ListSecretVersionsResponse:
        principal = await check(context, "ListSecretVersions", request)
        secret = request.parent
        viewers = google.viewers.get(project(secret), set()) | google.viewers.get(secret, set())
        if principal not in viewers:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"Permission 'secretmanager.versions.list' denied for resource '{secret}' "
                "(or it may not exist).",
            )
        if secret not in google.secrets:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Secret [{secret}] not found.")
        numbers = range(len(google.secrets[secret]), 0, -1)  # newest first, as Google lists
        states = {
            f"{secret}/versions/{n}": "DISABLED"
            if f"{secret}/versions/{n}" in google.disabled
            else "ENABLED"
            for n in numbers
        }
        try:
            names = [n for n, state in states.items() if matches(request.filter, n, {}, state)]
        except ValueError as bad:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid filter: {bad}")
            raise
        page, token = paged(names, request.page_size, request.page_token)
        versions = [
            resources.SecretVersion(name=n, state=resources.SecretVersion.State[states[n]])
            for n in page
        ]
        return service.ListSecretVersionsResponse(versions=versions, next_page_token=token)

    return {
        "ListSecrets": grpc.unary_unary_rpc_method_handler(
            list_secrets,
            request_deserializer=service.ListSecretsRequest.deserialize,
            response_serializer=service.ListSecretsResponse.serialize,
        ),
        "ListSecretVersions": grpc.unary_unary_rpc_method_handler(
            list_versions,
            request_deserializer=service.ListSecretVersionsRequest.deserialize,
            response_serializer=service.ListSecretVersionsResponse.serialize,
        ),
    }


async def start_secret_manager(
    google: FakeGoogle, label: str, regional: bool, tls: tuple[bytes, bytes] | None = None
) -> tuple[Any, int]:
    """A Secret Manager on 127.0.0.1: TLS with (key, cert) PEMs, else gRPC local credentials."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((secret_manager_handler(google, label, regional),))
    if tls is not None:
        creds = grpc.ssl_server_credentials([tls])
    else:
        creds = grpc.local_server_credentials(grpc.LocalConnectionType.LOCAL_TCP)
    port = server.add_secure_port("127.0.0.1:0", creds)
    await server.start()
    return server, port


# -- STS, IAM credentials, OAuth, Kubernetes (HTTP) -----------------------------------------------


def http_app(google: FakeGoogle) -> web.Application:
    async def sts(request: web.Request) -> web.Response:
        form = {k: str(v) for k, v in (await request.post()).items()}
        google.sts_requests.append(form)
        if google.sts_failures:
            return web.json_response({"error": "unavailable"}, status=google.sts_failures.pop(0))
        subject = google.pod_tokens.get(form.get("subject_token", ""))
        if (
            form.get("grant_type") != "urn:ietf:params:oauth:grant-type:token-exchange"
            or form.get("subject_token_type") != "urn:ietf:params:oauth:token-type:jwt"
            or form.get("audience") != google.sts_audience
            or subject is None
        ):
            return web.json_response(
                {"error": "invalid_grant", "error_description": "The audience or token is invalid"},
                status=400,
            )
        return web.json_response(
            {
                "access_token": google.issue(f"ksa:{subject}"),
                "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
                "token_type": "Bearer",
                "expires_in": google.lifetime,
            }
        )

    async def iam(request: web.Request) -> web.Response:
        target = request.match_info["target"]
        if target.endswith(":signJwt"):
            return await sign_jwt(request, target.removesuffix(":signJwt"))
        gsa = target.removesuffix(":generateAccessToken")
        body = await request.json()
        auth = request.headers.get("Authorization", "")
        caller = google.tokens.get(auth.removeprefix("Bearer "))
        google.iam_requests.append({"gsa": gsa, "caller": caller, "body": body})
        if caller is None:
            return web.json_response({"error": {"code": 401}}, status=401)
        if caller not in google.impersonators.get(gsa, set()):
            msg = "Permission 'iam.serviceAccounts.getAccessToken' denied on resource"
            return web.json_response({"error": {"code": 403, "message": msg}}, status=403)
        expire = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + google.lifetime))
        return web.json_response({"accessToken": google.issue(f"gsa:{gsa}"), "expireTime": expire})

    async def sign_jwt(request: web.Request, gsa: str) -> web.Response:
        body = await request.json()
        auth = request.headers.get("Authorization", "")
        caller = google.tokens.get(auth.removeprefix("Bearer "))
        google.iam_requests.append({"gsa": gsa, "caller": caller, "body": body, "signJwt": True})
        if caller is None:
            return web.json_response(
                {"error": {"code": 401, "status": "UNAUTHENTICATED"}}, status=401
            )
        if caller not in google.signers.get(gsa, set()):
            msg = (
                "Permission 'iam.serviceAccounts.signJwt' denied on resource (or it may not exist)."
            )
            return web.json_response(
                {"error": {"code": 403, "message": msg, "status": "PERMISSION_DENIED"}}, status=403
            )
        try:
            kid, signed = google.sign_jwt(gsa, str(body.get("payload", "")))
        except (ValueError, TypeError):
            error = {"code": 400, "message": "Invalid payload", "status": "INVALID_ARGUMENT"}
            return web.json_response({"error": error}, status=400)
        return web.json_response({"keyId": kid, "signedJwt": signed})

    async def get_service_account(request: web.Request) -> web.Response:
        email = request.match_info["target"]
        if email not in google.service_accounts:
            error = {"code": 404, "status": "NOT_FOUND"}
            return web.json_response({"error": error}, status=404)
        unique_id, project_id = google.service_accounts[email]
        return web.json_response(
            {
                "name": f"projects/{project_id}/serviceAccounts/{email}",
                "email": email,
                "uniqueId": unique_id,
                "projectId": project_id,
            }
        )

    async def x509_keys(request: web.Request) -> web.Response:
        return web.json_response(google.x509_keys(request.match_info["email"]))

    async def jwk_keys(request: web.Request) -> web.Response:
        return web.json_response(google.jwks(request.match_info["email"]))

    async def oauth(request: web.Request) -> web.Response:
        form = {k: str(v) for k, v in (await request.post()).items()}
        google.oauth_requests.append(form)
        google.oauth_urls.append(str(request.url))
        claims = google.check_assertion(form)
        if isinstance(claims, tuple):
            error, description = claims
            return web.json_response({"error": error, "error_description": description}, status=400)
        google.assertions.append(claims)
        return web.json_response(
            {
                "access_token": google.issue(f"gsa:{claims['iss']}"),
                "expires_in": google.lifetime,
                "token_type": "Bearer",
            }
        )

    async def service_account(request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        key = f"{ns}/{name}"
        if key not in google.annotations:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        meta = {"name": name, "namespace": ns, "annotations": google.annotations[key]}
        return web.json_response({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta})

    app = web.Application()
    app.router.add_post("/v1/token", sts)
    app.router.add_post("/v1/projects/-/serviceAccounts/{target}", iam)
    app.router.add_get("/v1/projects/-/serviceAccounts/{target}", get_service_account)
    app.router.add_get("/service_accounts/v1/metadata/x509/{email}", x509_keys)
    app.router.add_get("/service_accounts/v1/jwk/{email}", jwk_keys)
    app.router.add_post("/oauth2/token", oauth)
    app.router.add_get("/api/v1/namespaces/{ns}/serviceaccounts/{name}", service_account)
    return app


async def start_http(
    google: FakeGoogle, context: ssl.SSLContext | None = None
) -> tuple[web.AppRunner, str]:
    """STS, IAM, OAuth and the ServiceAccount read on 127.0.0.1 (HTTPS with `context`);
    returns the runner and the base URL."""
    runner, port = await serve_app(http_app(google), ssl_context=context)
    scheme, host = ("https", "localhost") if context else ("http", "127.0.0.1")
    return runner, f"{scheme}://{host}:{port}"
