"""A secret never becomes more readable by being templated, extracted or exploded: files an
object yields get its mode, and a template's default mode is the strictest of its inputs."""

from __future__ import annotations

import pytest
import yaml

from devkit.testing import Harness

STORE = {"secrets": {"db": {"user": "app", "password": "pw-1"}, "api": "key-123"}}


async def modes(harness: Harness, objects: list[dict[str, object]], tmpl: object) -> dict[str, int]:
    harness.write(STORE)
    request = harness.request(objects, templates=yaml.safe_dump(tmpl))
    result = await harness.mounter.mount(request)
    return {f.path: f.mode for f in result.files}


@pytest.mark.parametrize(
    ("db_mode", "api_mode", "expected"),
    [
        (0o400, 0o400, 0o400),  # every input 0400: the template too (was 0644)
        (0o440, 0o600, 0o400),  # group-readable and owner-writable: readable by owner only
        (None, 0o400, 0o400),  # the request's default 0644 for db, 0400 for api
        (None, None, 0o644),  # nothing stricter than the request's default
    ],
)
async def test_template_default_mode_is_the_strictest_input(
    harness: Harness, db_mode: int | None, api_mode: int | None, expected: int
) -> None:
    objects: list[dict[str, object]] = [
        {"objectName": "db", "secretPath": "db", "explode": True},
        {"objectName": "api", "secretPath": "api"},
    ]
    for obj, mode in zip(objects, (db_mode, api_mode), strict=True):
        if mode is not None:
            obj["filePermission"] = mode
    got = await modes(harness, objects, [{"path": "app.env", "format": "env"}])
    assert got["app.env"] == expected


async def test_template_mode_given_wins_and_covers_only_its_objects(harness: Harness) -> None:
    objects = [
        {"objectName": "db", "secretPath": "db", "explode": True, "filePermission": 0o400},
        {"objectName": "api", "secretPath": "api", "filePermission": 0o440},
    ]
    tmpl = [
        {"path": "explicit", "mode": 0o644, "format": "env"},
        {"path": "api.env", "format": "env", "objects": ["api"]},
        {"path": "user", "template": "${db/user}"},
    ]
    got = await modes(harness, objects, tmpl)
    assert got["explicit"] == 0o644  # the class said so, in the template itself
    assert got["api.env"] == 0o440
    assert got["user"] == 0o400


async def test_exploded_and_extracted_files_keep_the_object_mode(harness: Harness) -> None:
    objects = [
        {"objectName": "db", "secretPath": "db", "explode": True, "filePermission": 0o400},
        {"objectName": "pw", "secretPath": "db", "extract": "password", "filePermission": 0o440},
    ]
    got = await modes(harness, objects, [])
    assert got == {"db/user": 0o400, "db/password": 0o400, "pw": 0o440}
