"""MountRequest fields -> MountInput (docs/architecture.md)."""

from __future__ import annotations

import json

import pytest

from provider.core.errors import InvalidParameters
from provider.edge.attributes import TOKENS, parse_request

POD = {
    "csi.storage.k8s.io/pod.name": "web-1",
    "csi.storage.k8s.io/pod.namespace": "shop",
    "csi.storage.k8s.io/pod.uid": "u-1",
    "csi.storage.k8s.io/serviceAccount.name": "web",
}


def test_pod_tokens_and_params() -> None:
    tokens = {
        "vault": {"token": "jwt-v", "expirationTimestamp": "2030-01-01T00:00:00Z"},
        "": {"token": "jwt-default", "expirationTimestamp": ""},
    }
    attrs = {**POD, "backend": "fake", TOKENS: json.dumps(tokens)}
    got = parse_request(json.dumps(attrs), "null", "420", "/t")
    assert got.pod.namespace == "shop" and got.pod.service_account == "web"
    assert got.pod.tokens["vault"].token == "jwt-v"
    assert got.pod.tokens[""].token == "jwt-default"
    assert TOKENS not in got.params and got.params["backend"] == "fake"
    assert got.permission == 0o644
    assert "jwt-v" not in repr(got)


def test_tokens_may_arrive_in_secrets() -> None:
    tokens = json.dumps({"vault": {"token": "jwt-s", "expirationTimestamp": ""}})
    got = parse_request(json.dumps(POD), json.dumps({TOKENS: tokens, "clientid": "c"}), "420", "")
    assert got.pod.tokens["vault"].token == "jwt-s"
    assert got.pod.node_publish_secret == {"clientid": "c"}


@pytest.mark.parametrize("secrets", ["null", "", "{}"])
def test_empty_secrets(secrets: str) -> None:
    assert parse_request(json.dumps(POD), secrets, "420", "").pod.node_publish_secret == {}


@pytest.mark.parametrize(
    ("attributes", "secrets", "permission", "message"),
    [
        ("", "null", "420", "attributes: not valid JSON"),
        ('"x"', "null", "420", "attributes: expected a JSON object, got str"),
        (json.dumps({**POD, "n": 1}), "null", "420", "not a string: n"),
        (json.dumps({**POD, TOKENS: "[]"}), "null", "420", f"{TOKENS}: expected a JSON object"),
        (json.dumps({**POD, TOKENS: '{"a": {"token": 1}}'}), "null", "420", "audience 'a'"),
        (json.dumps(POD), '{"a": 1}', "420", "secrets: nodePublishSecretRef values"),
        (json.dumps(POD), "nul", "420", "secrets: not valid JSON"),
        (json.dumps(POD), "null", "1000", "permission"),
        (json.dumps(POD), "null", "-1", "permission"),
        (json.dumps(POD), "null", "true", "permission"),
        (json.dumps({"backend": "fake"}), "null", "420", "podInfoOnMount"),
    ],
)
def test_malformed(attributes: str, secrets: str, permission: str, message: str) -> None:
    with pytest.raises(InvalidParameters) as info:
        parse_request(attributes, secrets, permission, "")
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("permission", "mode"),
    [("420", 0o644), ("0", 0), ("511", 0o777), (" 384 ", 0o600), ("", 0o644)],
)
def test_permission(permission: str, mode: int) -> None:
    assert parse_request(json.dumps(POD), "null", permission, "").permission == mode


# A leading zero is not JSON (no octal guess), and a hostile digit string is refused, not
# converted (Python refuses int() of over 4,300 digits with an error of its own).
@pytest.mark.parametrize("permission", ["0644", "00", "512", "9" * 100_000, "4e2", "٤٢٠"])
def test_permission_refused(permission: str) -> None:
    with pytest.raises(InvalidParameters, match="permission: expected a decimal file mode"):
        parse_request(json.dumps(POD), "null", permission, "")
