"""Malformed requests: each gets a clean status code and a message naming the field."""

from __future__ import annotations

import json

import grpc
import pytest
import yaml

from devkit.serving import Provider
from devkit.testing import attributes, mount_request

POD = {
    "csi.storage.k8s.io/pod.name": "app-0",
    "csi.storage.k8s.io/pod.namespace": "default",
    "csi.storage.k8s.io/serviceAccount.name": "app",
}
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def objects(*items: dict[str, object]) -> str:
    return yaml.safe_dump(list(items))


CASES = [
    ("bad JSON", mount_request("{not json"), INVALID, "attributes: not valid JSON"),
    ("not an object", mount_request("[1, 2]"), INVALID, "expected a JSON object"),
    (
        "non-string value",
        mount_request(json.dumps({**POD, "backend": 1})),
        INVALID,
        "not a string: backend",
    ),
    (
        "missing backend",
        mount_request(json.dumps({**POD, "objects": "[]"})),
        INVALID,
        "parameter 'backend' is missing",
    ),
    (
        "unknown backend",
        mount_request(json.dumps({**POD, "backend": "vaultt"})),
        INVALID,
        "expected one of",
    ),
    (
        "missing pod keys",
        mount_request(json.dumps({"backend": "fake"})),
        INVALID,
        "csi.storage.k8s.io/pod.namespace",
    ),
    (
        "bad tokens JSON",
        mount_request(
            attributes(
                [{"objectName": "api-key"}], **{"csi.storage.k8s.io/serviceAccount.tokens": "{oops"}
            )
        ),
        INVALID,
        "csi.storage.k8s.io/serviceAccount.tokens: not valid JSON",
    ),
    (
        "token entry shape",
        mount_request(
            attributes(
                [{"objectName": "api-key"}],
                **{"csi.storage.k8s.io/serviceAccount.tokens": json.dumps({"vault": "jwt"})},
            )
        ),
        INVALID,
        "audience 'vault'",
    ),
    (
        "bad secrets",
        mount_request(attributes([{"objectName": "api-key"}]), secrets="[]"),
        INVALID,
        "secrets: expected a JSON object",
    ),
    (
        "bad permission",
        mount_request(attributes([{"objectName": "api-key"}]), permission="rw"),
        INVALID,
        "permission",
    ),
    (
        "objects not YAML",
        mount_request(attributes("- [unclosed")),
        INVALID,
        "objects: invalid YAML",
    ),
    (
        "duplicate names",
        mount_request(
            attributes(
                objects(
                    {"objectName": "a", "secretPath": "api-key"},
                    {"objectName": "a", "secretPath": "db-creds"},
                )
            )
        ),
        INVALID,
        "objectName 'a' is used by",
    ),
    (
        "parent path",
        mount_request(attributes(objects({"objectName": "../x"}))),
        INVALID,
        "'..' element",
    ),
    ("dot path", mount_request(attributes(objects({"objectName": "./x"}))), INVALID, "clean form"),
    (
        "double slash",
        mount_request(attributes(objects({"objectName": "a//b"}))),
        INVALID,
        "clean form",
    ),
    (
        "..data",
        mount_request(attributes(objects({"objectName": "..data"}))),
        INVALID,
        "starts with '..'",
    ),
    (
        "absolute",
        mount_request(attributes(objects({"objectName": "/etc/passwd"}))),
        INVALID,
        "absolute",
    ),
    (
        # An unknown object key is only a warning (upstream drops it); a bad value is refused.
        "bad object value",
        mount_request(attributes(objects({"objectName": "a", "decode": "rot13"}))),
        INVALID,
        "objects[0].decode",
    ),
    (
        "too many objects",
        mount_request(
            attributes(
                objects(*[{"objectName": f"o{i}", "secretPath": "api-key"} for i in range(101)])
            )
        ),
        INVALID,
        "at most 100 (--max-objects)",
    ),
    (
        "oversize answer",
        mount_request(
            attributes(
                objects(*[{"objectName": f"big{i}", "secretPath": "big"} for i in range(20)])
            )
        ),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "--max-response-bytes",
    ),
    (
        "unknown placeholder",
        mount_request(
            attributes(
                [{"objectName": "api-key"}],
                templates=yaml.safe_dump([{"path": "t", "template": "${nope}"}]),
            )
        ),
        INVALID,
        "templates[0].template ('t'): unknown object 'nope'",
    ),
]


@pytest.mark.parametrize("provider", [{"max_response_bytes": 50_000}], indirect=True)
@pytest.mark.parametrize(
    ("request_", "code", "text"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
async def test_malformed_request(
    provider: Provider, request_: object, code: grpc.StatusCode, text: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await provider.stub.Mount(request_, timeout=10)
    assert info.value.code() == code
    assert text in info.value.details()


async def test_fake_backend_is_off_unless_enabled() -> None:
    from provider.core.errors import InvalidParameters
    from provider.mount.planning import parse_plan

    with pytest.raises(InvalidParameters, match="--enable-fake-backend"):
        parse_plan(
            {"backend": "fake", "objects": "[]"},
            options_for=lambda _n: None,
            enable_test_stores=False,
        )


async def test_oversized_request_is_refused_by_grpc(provider: Provider) -> None:
    huge = mount_request(attributes([{"objectName": "api-key"}], padding="x" * (5 * 1024 * 1024)))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await provider.stub.Mount(huge, timeout=10)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # The provider is still fine afterwards.
    ok = await provider.stub.Mount(
        mount_request(attributes([{"objectName": "api-key"}])), timeout=10
    )
    assert ok.files[0].contents == b"key-123"


async def test_large_objects_parameter_is_refused_by_us(provider: Provider) -> None:
    objects = yaml.safe_dump([{"objectName": f"o{i}", "secretPath": "x" * 60} for i in range(4000)])
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await provider.stub.Mount(mount_request(attributes(objects)), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "objects:" in info.value.details() and "limit" in info.value.details()
