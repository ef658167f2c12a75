"""Issue 20: no secret value in errors or logs, and object versions that are no oracle.

Library exceptions (jmespath, yaml, json, base64/hex) quote the value they failed on; each
becomes a fixed message naming the object and the expression. The suite's autouse log guard
(tests/conftest.py) checks every captured log line for the known test secrets ("s3cr3t").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from devkit.testing import Harness, make_pod
from provider.core.errors import InvalidParameters, MountFailed

SECRET = "s3cr3t"
MAP = json.dumps({"password": SECRET, "user": "app"})

# (case, secret, extension keys, text the message must carry)
RUNTIME_ERRORS: list[tuple[str, str, dict[str, Any], str]] = [
    ("abs of a string", MAP, {"extract": "abs(password)"}, "abs() expected number, got string"),
    ("ends_with on a map", MAP, {"extract": "ends_with(@, 'x')"}, "ends_with() expected string"),
    ("join of a map", MAP, {"extract": "join(',', @)"}, "join() expected array"),
    ("sort of a map", MAP, {"extract": "sort(@)"}, "sort() expected"),
    ("sum of strings", MAP, {"extract": "sum(values(@))"}, "sum() expected"),
    ("max_by of maps", json.dumps([{"a": {"x": SECRET}}]), {"extract": "max_by(@, &a)"}, "max_by"),
    ("bad base64", SECRET + "!", {"decode": "base64"}, "not valid base64"),
    ("bad hex", SECRET, {"decode": "hex"}, "not valid hex"),
    ("broken yaml", f"a: {SECRET}\n b: [", {"extract": "a"}, "neither JSON nor YAML"),
    ("yaml alias", f"a: &x {SECRET}\nb: *x\n", {"extract": "b"}, "aliases"),
]


@pytest.mark.parametrize(
    ("secret", "keys", "text"), [c[1:] for c in RUNTIME_ERRORS], ids=[c[0] for c in RUNTIME_ERRORS]
)
async def test_errors_never_quote_the_value(
    harness: Harness, caplog: pytest.LogCaptureFixture, secret: str, keys: dict[str, Any], text: str
) -> None:
    harness.write({"secrets": {"s": secret}})
    with pytest.raises(MountFailed) as info:
        await harness.files([{"objectName": "o", "secretPath": "s", **keys}])
    ((name, cause),) = info.value.failures
    assert name == "o" and isinstance(cause, InvalidParameters)
    assert text in str(cause)
    if "extract" in keys:
        assert f"extract expression {keys['extract']!r}" in str(cause) or "YAML" in str(cause)
    assert SECRET not in str(info.value) and SECRET not in caplog.text
    # No chained exception carries the library's text either.
    assert cause.__cause__ is None and cause.__context__ is None


async def test_unknown_function_and_arity_fail_at_parse_time(harness: Harness) -> None:
    for expression, text in [("nosuch(@)", "unknown function nosuch()"), ("abs(@, @)", "abs()")]:
        with pytest.raises(InvalidParameters, match=text.replace("(", r"\(").replace(")", r"\)")):
            await harness.files([{"objectName": "o", "extract": expression}])


def pod(namespace: str, service_account: str = "app", name: str = "p-0") -> Any:
    return make_pod(namespace=namespace, service_account=service_account, name=name, uid=name)


async def versions(harness: Harness, who: Any, path: str = "a-pin") -> dict[str, str]:
    objects = [{"objectName": "pin", "secretPath": path}]
    templates = "- path: pin.env\n  format: env\n"
    result = await harness.mounter.mount(harness.request(objects, pod=who, templates=templates))
    return {v.id: v.version for v in result.versions}


async def test_versions_are_no_oracle_across_namespaces(harness: Harness, tmp_path: Path) -> None:
    """B stores a guess of A's PIN under the same object name: equal content, yet the versions
    B can read differ from A's, so comparing them confirms nothing."""
    harness.write({"secrets": {"a-pin": "1234", "b-guess": "1234"}})
    a = await versions(harness, pod("tenant-a"))
    b = await versions(harness, pod("tenant-b"), path="b-guess")
    assert a["pin"] != b["pin"] and a["pin.env"] != b["pin.env"]
    # Stable within a namespace: other pods, other service accounts, a restart (same key).
    assert await versions(harness, pod("tenant-a", "other", "p-1")) == a
    (tmp_path / "restart").mkdir()
    restarted = Harness(tmp_path / "restart")  # the same key file contents, a new process
    restarted.write({"secrets": {"a-pin": "1234"}})
    assert await versions(restarted, pod("tenant-a")) == a
    # And still a change of content changes the version.
    harness.write({"secrets": {"a-pin": "1235", "b-guess": "1234"}})
    assert (await versions(harness, pod("tenant-a")))["pin"] != a["pin"]
