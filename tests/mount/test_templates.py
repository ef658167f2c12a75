"""Templates and formats across objects (issue 7), through the fake store."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from devkit.testing import Harness
from provider.core.errors import InvalidParameters

STORE = {
    "secrets": {
        "db": {"user": "app", "password": 'p\'w $HOME `x` "q"', "host": "db.internal"},
        "api": "key-1",
    }
}
OBJECTS = [
    {"objectName": "db", "secretPath": "db", "explode": True, "file": False},
    {"objectName": "api-key", "secretPath": "api"},
]


def templates(*entries: dict[str, object]) -> str:
    return yaml.safe_dump(list(entries))


async def test_env_file_is_sourced_by_bash(harness: Harness, tmp_path: Path) -> None:
    harness.write(STORE)
    files = await harness.files(OBJECTS, templates=templates({"path": "app.env", "format": "env"}))
    assert set(files) == {"api-key", "app.env"}  # file: false objects feed templates only
    env = tmp_path / "app.env"
    env.write_bytes(files["app.env"])
    out = subprocess.run(
        ["bash", "-c", f'set -a; . "{env}"; printf "%s\\n" "$DB_PASSWORD" "$DB_USER" "$API_KEY"'],
        capture_output=True,
        check=True,
        text=True,
    ).stdout.splitlines()
    assert out == ['p\'w $HOME `x` "q"', "app", "key-1"]


async def test_pgpass_template_and_literal_dollar(harness: Harness) -> None:
    harness.write(STORE)
    tmpl = "${db/host}:5432:*:${db/user}:${db/password}\n# costs $$5\n"
    files = await harness.files(
        OBJECTS, templates=templates({"path": "pgpass", "mode": 0o400, "template": tmpl})
    )
    assert files["pgpass"] == b'db.internal:5432:*:app:p\'w $HOME `x` "q"\n# costs $5\n'


async def test_json_and_properties_formats_with_subset(harness: Harness) -> None:
    harness.write(STORE)
    files = await harness.files(
        OBJECTS,
        templates=templates(
            {"path": "c.json", "format": "json", "objects": ["db/user", "api-key"]},
            {"path": "c.properties", "format": "properties", "objects": ["db/host"]},
        ),
    )
    assert json.loads(files["c.json"]) == {"db/user": "app", "api-key": "key-1"}
    assert files["c.properties"] == b"db/host=db.internal\n"


async def test_template_versions_follow_their_inputs(harness: Harness) -> None:
    harness.write(STORE)
    tmpl = templates({"path": "t", "template": "${api-key}"})
    req = harness.request(OBJECTS, templates=tmpl)
    first = {v.id: v.version for v in (await harness.mounter.mount(req)).versions}
    harness.write({"secrets": {**STORE["secrets"], "api": "key-2"}})
    second = {v.id: v.version for v in (await harness.mounter.mount(req)).versions}
    assert first["t"] != second["t"]


@pytest.mark.parametrize(
    ("entry", "text"),
    [
        (
            {"path": "t", "template": "${nope}"},
            "templates[0].template ('t'): unknown object 'nope'",
        ),
        ({"path": "t", "template": "${bad name}"}, "malformed placeholder"),
        ({"path": "t", "template": "x", "format": "env"}, "exactly one of 'template' or 'format'"),
        ({"path": "t", "format": "xml"}, "templates[0].format: expected env, properties or json"),
        ({"path": "t", "format": "env", "objects": ["ghost"]}, "unknown object 'ghost'"),
        ({"path": "../t", "template": "x"}, "templates[0].path"),
        ({"path": "api-key", "template": "x"}, "two files would be written to 'api-key'"),
        ({"template": "x"}, "templates[0].path is required"),
        (
            {"path": "t", "template": "x", "owner": "root"},
            "templates[0].owner is not a parameter of a template (known: format, mode, objects",
        ),
        (
            {"path": "t", "templte": "x"},
            "templates[0].templte is not a parameter of a template; did you mean 'template'?",
        ),
    ],
)
async def test_template_errors(harness: Harness, entry: dict[str, object], text: str) -> None:
    harness.write(STORE)
    with pytest.raises(InvalidParameters) as info:
        await harness.files(OBJECTS, templates=templates(entry))
    assert text in str(info.value)


async def test_binary_value_in_text_template_is_refused(harness: Harness) -> None:
    harness.write({"secrets": {"bin": "/w=="}})
    objects = [{"objectName": "b", "secretPath": "bin", "decode": "base64"}]
    with pytest.raises(InvalidParameters, match="'b' is binary"):
        await harness.files(objects, templates=templates({"path": "t", "template": "${b}"}))


async def test_only_file_false_and_no_template_is_refused(harness: Harness) -> None:
    with pytest.raises(InvalidParameters, match="writes no files"):
        await harness.files([{"objectName": "a", "file": False}])
