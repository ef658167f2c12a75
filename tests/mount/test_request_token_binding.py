"""Each token a Mount carries must have been issued to the request's pod (issue 40, item 7;
provider/core/podtokens.py): its Kubernetes claims against the kubelet's pod keys. The attack
itself, through gRPC against OpenBao, is tests/e2e/test_e2e_token_binding.py."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from backends.vault.store import create
from devkit.testing import make_env
from devkit.tokens import SigningKey
from provider.core.errors import InvalidParameters, PermissionDenied
from provider.mount.mounting import MountInput
from provider.mount.request import (
    POD_NAME,
    POD_NAMESPACE,
    POD_UID,
    SERVICE_ACCOUNT,
    TOKENS,
    parse_request,
)
from tests.backends.vault.conftest import plan_for

KEY = SigningKey.generate()
POD = {POD_NAME: "web-1", POD_NAMESPACE: "shop", POD_UID: "uid-web-1", SERVICE_ACCOUNT: "web"}


def tokens_json(token: str, audience: str = "vault") -> str:
    return json.dumps({audience: {"token": token, "expirationTimestamp": ""}})


def parse(token: str, *, in_secret: bool = False, **pod: str) -> MountInput:
    attrs: dict[str, str] = {**POD, **pod, "backend": "vault"}
    secrets = "null"
    if in_secret:
        secrets = json.dumps({TOKENS: tokens_json(token), "other": "kept"})
    else:
        attrs[TOKENS] = tokens_json(token)
    return parse_request(json.dumps(attrs), secrets, "420", "/t")


def unsigned(claims: dict[str, Any]) -> str:
    """A JWT with these claims and no valid signature: claims are read without checking it."""

    def part(value: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2ln"


@pytest.mark.parametrize(
    ("token", "claim", "attribute", "got", "want"),
    [
        (
            KEY.pod_token("other", "web", pod="web-1"),
            "kubernetes.io.namespace",
            POD_NAMESPACE,
            "other",
            "shop",
        ),
        (
            KEY.pod_token("shop", "admin", pod="web-1"),
            "kubernetes.io.serviceaccount.name",
            SERVICE_ACCOUNT,
            "admin",
            "web",
        ),
        (
            KEY.pod_token("shop", "web", pod="web-2"),
            "kubernetes.io.pod.name",
            POD_NAME,
            "web-2",
            "web-1",
        ),
        (
            unsigned(
                {
                    "kubernetes.io": {
                        "namespace": "shop",
                        "serviceaccount": {"name": "web"},
                        "pod": {"name": "web-1", "uid": "uid-other"},
                    }
                }
            ),
            "kubernetes.io.pod.uid",
            POD_UID,
            "uid-other",
            "uid-web-1",
        ),
        (
            unsigned({"sub": "system:serviceaccount:other:web"}),
            "sub namespace",
            POD_NAMESPACE,
            "other",
            "shop",
        ),
        (
            unsigned({"sub": "system:serviceaccount:shop:admin"}),
            "sub name",
            SERVICE_ACCOUNT,
            "admin",
            "web",
        ),
    ],
)
def test_a_token_issued_to_another_pod_is_refused_naming_claim_and_attribute(
    token: str, claim: str, attribute: str, got: str, want: str
) -> None:
    with pytest.raises(PermissionDenied) as caught:
        parse(token)
    text = str(caught.value)
    assert f"issued to {claim} {got!r}, not to this pod's {attribute} {want!r}" in text
    assert text.startswith(f"{TOKENS}: the token for audience 'vault'")
    assert token not in text and token.split(".")[1] not in text


def test_the_nodepublishsecretref_tokens_are_checked_and_not_kept_as_its_data() -> None:
    with pytest.raises(PermissionDenied, match=f"^secrets: {TOKENS}: .*'other'"):
        parse(KEY.pod_token("other", "web"), in_secret=True)
    got = parse(KEY.pod_token("shop", "web", pod="web-1"), in_secret=True)
    assert set(got.pod.tokens) == {"vault"}
    assert dict(got.pod.node_publish_secret) == {"other": "kept"}


@pytest.mark.parametrize(
    "token",
    [
        KEY.pod_token("shop", "web", pod="web-1"),  # the kubelet's: bound to the pod
        KEY.pod_token("shop", "web"),  # bound to no pod (kubectl create token, sync controller)
        unsigned({"sub": "system:serviceaccount:shop:web"}),  # legacy Secret-based token
        "not-a-jwt",  # proves no service account: left to the store, which refuses it
    ],
)
def test_a_token_of_this_pod_or_of_its_account_unbound_is_accepted(token: str) -> None:
    assert parse(token).pod.tokens["vault"].token == token


def test_the_sync_controllers_request_with_its_own_pod_and_an_unbound_token_is_accepted() -> None:
    token = KEY.pod_token("team-a", "reader")  # minted for the SecretSync's account, no pod
    got = parse(token, **{POD_NAMESPACE: "team-a", SERVICE_ACCOUNT: "reader", POD_NAME: "ssc-0"})
    assert got.pod.tokens["vault"].token == token
    # Its downward-API env unset: no pod name or uid at all.
    assert parse(
        token, **{POD_NAMESPACE: "team-a", SERVICE_ACCOUNT: "reader", POD_NAME: "", POD_UID: ""}
    )


@pytest.mark.parametrize(
    ("token", "problem"),
    [
        ("a.%%%.c", "is not a Kubernetes service-account token"),
        (unsigned(["a list"]), "is not a Kubernetes service-account token"),  # type: ignore[arg-type]
        (unsigned({"sub": "someone"}), "names no namespace and service account"),
        (
            unsigned({"iss": "https://accounts.google.com"}),
            "names no namespace and service account",
        ),
        (
            unsigned({"kubernetes.io": {"namespace": 7, "serviceaccount": {"name": "web"}}}),
            "its claim kubernetes.io.namespace is not a string",
        ),
    ],
)
def test_a_jwt_whose_claims_name_no_service_account_is_refused_as_malformed(
    token: str, problem: str
) -> None:
    with pytest.raises(InvalidParameters) as caught:
        parse(token)
    assert problem in str(caught.value) and "tokenRequests" in str(caught.value)
    assert token not in str(caught.value)


async def test_after_the_check_the_identity_key_is_what_the_token_proves() -> None:
    """The caches and the Vault login are keyed by the kubelet's namespace and service account;
    a token that passed names the same ones, so no key can hold another account's login."""
    token = KEY.pod_token("shop", "web", pod="web-1")
    pod = parse(token).pod
    proven = KEY.verify(token)["kubernetes.io"]
    env = make_env("vault")
    backend = create(env)
    try:
        plan = plan_for(
            "- {objectName: f, secretPath: secret/data/x}",
            roleName="r",
            vaultAddress="http://127.0.0.1:1",
        )
        identity = await backend.identify(plan, pod)
    finally:
        await backend.close()
        await env.kube.close()
    assert identity.key.endswith(f"{proven['namespace']}/{proven['serviceaccount']['name']}")
    assert identity.credential == token
