"""Transforms through the fake store (issue 7): a table of inputs, extensions and results."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from devkit.testing import Harness
from provider.core.errors import InvalidParameters, MountFailed, NotFound

NESTED = '{"db": {"user": "app", "port": 5432, "tls": true, "hosts": ["a", "b"]}, "x": null}'
HYPHEN = '{"db-password": "pw", "a.b": "dotted", "n": 1.5}'
YAML = "user: app\npassword: pw\nlist:\n  - 1\n  - 2\n"
B64 = base64.b64encode(b"\x00\xffbinary\x80").decode()

# (case id, secret, object extension keys, expected {path: bytes})
OK: list[tuple[str, Any, dict[str, Any], dict[str, bytes]]] = [
    ("nested key", NESTED, {"extract": "db.user"}, {"o": b"app"}),
    ("number", NESTED, {"extract": "db.port"}, {"o": b"5432"}),
    ("boolean", NESTED, {"extract": "db.tls"}, {"o": b"true"}),
    ("array", NESTED, {"extract": "db.hosts"}, {"o": b'["a","b"]'}),
    ("array index", NESTED, {"extract": "db.hosts[1]"}, {"o": b"b"}),
    (
        "object",
        NESTED,
        {"extract": "db"},
        {"o": b'{"user":"app","port":5432,"tls":true,"hosts":["a","b"]}'},
    ),
    ("hyphen quoted", HYPHEN, {"extract": '"db-password"'}, {"o": b"pw"}),
    ("dot quoted", HYPHEN, {"extract": '"a.b"'}, {"o": b"dotted"}),
    ("float", HYPHEN, {"extract": "n"}, {"o": b"1.5"}),
    ("yaml key", YAML, {"extract": "password"}, {"o": b"pw"}),
    ("yaml list", YAML, {"extract": "list"}, {"o": b"[1,2]"}),
    (
        "explode json",
        HYPHEN,
        {"explode": True},
        {"o/db-password": b"pw", "o/a.b": b"dotted", "o/n": b"1.5"},
    ),
    (
        "explode yaml",
        YAML,
        {"explode": True},
        {"o/user": b"app", "o/password": b"pw", "o/list": b"[1,2]"},
    ),
    (
        "explode extracted",
        NESTED,
        {"extract": "db", "explode": True},
        {"o/user": b"app", "o/port": b"5432", "o/tls": b"true", "o/hosts": b'["a","b"]'},
    ),
    ("base64 binary", B64, {"decode": "base64"}, {"o": b"\x00\xffbinary\x80"}),
    ("hex", "68656c6c6f", {"decode": "hex"}, {"o": b"hello"}),
    (
        "extract then decode",
        '{"k": "' + B64 + '"}',
        {"extract": "k", "decode": "base64"},
        {"o": b"\x00\xffbinary\x80"},
    ),
    ("no transform keeps bytes", "plain \u00e9", {}, {"o": "plain \u00e9".encode()}),
]

BAD: list[tuple[str, Any, dict[str, Any], type[Exception], str]] = [
    ("missing key", NESTED, {"extract": "db.nope"}, NotFound, "matched nothing"),
    ("not json or yaml", "{{{: [", {"extract": "a"}, InvalidParameters, "neither JSON nor YAML"),
    ("scalar yaml", "just text", {"extract": "a"}, NotFound, "matched nothing"),
    ("invalid base64", "not*base64!", {"decode": "base64"}, InvalidParameters, "not valid base64"),
    ("invalid hex", "zz", {"decode": "hex"}, InvalidParameters, "not valid hex"),
    (
        "explode a list",
        '["a"]',
        {"explode": True},
        InvalidParameters,
        "explode needs a JSON/YAML map",
    ),
    ("explode bad key", '{"../x": "a"}', {"explode": True}, InvalidParameters, "'..' element"),
    ("binary extract", None, {"extract": "a"}, InvalidParameters, "binary"),
]


@pytest.mark.parametrize(
    ("secret", "keys", "expected"), [c[1:] for c in OK], ids=[c[0] for c in OK]
)
async def test_transform(
    harness: Harness, secret: str, keys: dict[str, Any], expected: dict[str, bytes]
) -> None:
    harness.write({"secrets": {"s": secret}})
    assert await harness.files([{"objectName": "o", "secretPath": "s", **keys}]) == expected


@pytest.mark.parametrize(
    ("secret", "keys", "error", "text"), [c[1:] for c in BAD], ids=[c[0] for c in BAD]
)
async def test_transform_errors(
    harness: Harness, secret: Any, keys: dict[str, Any], error: type[Exception], text: str
) -> None:
    harness.write({"secrets": {"s": secret if secret is not None else b"\xff\xfe\x00"}})
    with pytest.raises(MountFailed) as info:
        await harness.files([{"objectName": "o", "secretPath": "s", **keys}])
    ((name, cause),) = info.value.failures
    assert name == "o" and isinstance(cause, error) and text in str(cause)
    # The secret's value never appears in the message.
    if isinstance(secret, str) and len(secret) > 4:
        assert secret not in str(info.value)


@pytest.mark.parametrize(
    ("keys", "text"),
    [
        ({"extract": "a[?"}, "objects[0].extract: invalid JMESPath"),
        ({"decode": "rot13"}, "objects[0].decode: expected base64 or hex"),
        ({"explode": "maybe"}, "objects[0].explode"),
        ({"file": "no"}, "objects[0].file"),
    ],
)
async def test_transform_parameters_are_validated(
    harness: Harness, keys: dict[str, Any], text: str
) -> None:
    with pytest.raises(InvalidParameters, match=text.replace("[", r"\[")):
        await harness.files([{"objectName": "o", **keys}])
