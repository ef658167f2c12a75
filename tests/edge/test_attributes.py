"""MountRequest fields -> MountInput (docs/architecture.md)."""

from __future__ import annotations

import json
import logging
import time

import grpc
import pytest

from devkit.serving import Provider
from devkit.testing import attributes, mount_request
from provider.core.errors import InvalidParameters
from provider.mount.request import TOKENS, parse_request

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


# Issue 32: nesting deeper than the JSON decoder's recursion limit was a RecursionError that
# ended as INTERNAL with a traceback in the log. The driver's JSON is at most 2 levels deep.
DEEP = "[" * 100_000
DEEP_OBJECT = '{"a": ' * 5_000 + "1" + "}" * 5_000


def _deep_tokens(inner: str) -> str:
    return '{"vault": {"token": "jwt", "expirationTimestamp": "", "x": ' + inner + "}}"


NESTED = [
    ("attributes", DEEP, "null", "attributes"),
    ("attributes object", DEEP_OBJECT, "null", "attributes"),
    ("tokens", json.dumps({**POD, TOKENS: DEEP}), "null", TOKENS),
    ("tokens entry", json.dumps({**POD, TOKENS: _deep_tokens(DEEP_OBJECT)}), "null", TOKENS),
    ("secrets", json.dumps(POD), DEEP, "secrets"),
    ("tokens in secrets", json.dumps(POD), json.dumps({TOKENS: DEEP}), TOKENS),
]


@pytest.mark.parametrize(
    ("attributes", "secrets", "field"), [c[1:] for c in NESTED], ids=[c[0] for c in NESTED]
)
def test_deep_nesting_is_refused_naming_field_and_limit(
    attributes: str, secrets: str, field: str
) -> None:
    with pytest.raises(InvalidParameters) as info:
        parse_request(attributes, secrets, "420", "")
    message = str(info.value)
    assert message.startswith(f"{field}: JSON nested too deeply")
    assert "levels" in message and "\n" not in message
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_deep_permission_is_not_a_mode() -> None:
    with pytest.raises(InvalidParameters, match="permission: expected a decimal file mode"):
        parse_request(json.dumps(POD), "null", DEEP, "")


def test_expiration_must_be_a_string() -> None:
    tokens = json.dumps({"vault": {"token": "jwt", "expirationTimestamp": [[[1]]]}})
    with pytest.raises(InvalidParameters, match="audience 'vault' must be"):
        parse_request(json.dumps({**POD, TOKENS: tokens}), "null", "420", "")


def test_long_audience_is_cut_in_the_message() -> None:
    tokens = json.dumps({"a" * 100_000: "jwt"})
    with pytest.raises(InvalidParameters) as info:
        parse_request(json.dumps({**POD, TOKENS: tokens}), "null", "420", "")
    assert len(str(info.value)) < 300


@pytest.mark.serial  # timed (0.1 s): it failed with three workers on two cores
def test_hostile_4_mib_nesting_is_refused_at_once() -> None:
    """The decoder stops at its recursion limit: a 4 MiB request costs well under a millisecond
    (a depth scan of the same text cost 50-1000 ms; measured for issue 32)."""
    hostile = [
        json.dumps({**POD, TOKENS: "[" * (4 << 20)}),
        json.dumps({**POD, TOKENS: "[" * (2 << 20) + "]" * (2 << 20)}),
        json.dumps({**POD, TOKENS: '{"a":' * ((4 << 20) // 5)}),
        "[1," * ((4 << 20) // 3),
    ]
    for text in hostile:
        start = time.perf_counter()
        with pytest.raises(InvalidParameters, match="nested too deeply"):
            parse_request(text, "null", "420", "")
        assert time.perf_counter() - start < 0.1


async def test_deep_nesting_over_the_socket_is_invalid_argument(
    provider: Provider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    cases = [
        (attributes([{"objectName": "api-key"}], **{TOKENS: "[" * (3 << 20)}), "null", TOKENS),
        (
            attributes([{"objectName": "api-key"}], **{TOKENS: _deep_tokens(DEEP_OBJECT)}),
            "null",
            TOKENS,
        ),
        ('{"a": ' + "[" * 50_000, "null", "attributes"),
        (attributes([{"objectName": "api-key"}]), '{"a":' + "[" * 20_000, "secrets"),
    ]
    for attrs, secrets, field in cases:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await provider.stub.Mount(mount_request(attrs, secrets=secrets), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = info.value.details()
        assert details.startswith(f"{field}: JSON nested too deeply (")
        assert "levels" in details and "\n" not in details and len(details) < 200
    assert "Traceback" not in caplog.text and "RecursionError" not in caplog.text
    assert "mount failed unexpectedly" not in caplog.text
    assert not [r for r in caplog.records if r.exc_info]
    # The provider serves the next mount as usual.
    ok = await provider.stub.Mount(
        mount_request(attributes([{"objectName": "api-key"}])), timeout=10
    )
    assert ok.files[0].contents == b"key-123"
