"""`check` and `mount --csidriver` on classes of several stores (docs/multi-store.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.cli.test_cli_check_mount import EXAMPLES, cli, spc

STORES = {
    "vault": {"backend": "vault", "roleName": "app", "vaultAddress": "https://vault:8200"},
    "aws": {
        "backend": "aws",
        "region": "eu-west-1",
        "roleArn": "arn:aws:iam::111122223333:role/app",
    },
}
OBJECTS = [
    {"store": "vault", "objectName": "db-password", "secretPath": "secret/data/db"},
    {
        "store": "aws",
        "objectName": "prod/api-key",
        "objectType": "secretsmanager",
        "objectAlias": "api-key",
        "fallback": {"store": "vault", "objectName": "api-key", "secretPath": "secret/data/api"},
    },
]


def params(objects: list[object] = OBJECTS, **extra: object) -> dict[str, str]:
    return {
        "stores": yaml.safe_dump(extra.pop("stores", STORES), sort_keys=False),
        "objects": yaml.safe_dump(objects, sort_keys=False),
        "templates": "- {path: app.env, format: env}",
        **{k: str(v) for k, v in extra.items()},
    }


def test_check_shows_the_plan_per_store(tmp_path: Path) -> None:
    path = spc(tmp_path, params())
    text = cli("check", path)
    assert text.returncode == 0, text.stdout
    lines = text.stdout.splitlines()
    assert lines[-3].endswith(
        "valid (several stores; files: db-password, api-key, app.env; pod token audiences: "
        "vault, sts.amazonaws.com)"
    )
    assert lines[-2] == (
        "  store vault (vault): objects: db-password; fallback for: api-key; "
        "pod token audiences: vault"
    )
    assert lines[-1] == (
        "  store aws (aws): objects: api-key (fallback: objects[1].fallback.objectName); "
        "pod token audiences: sts.amazonaws.com"
    )
    doc = json.loads(cli("check", "--json", path).stdout)
    (cls,) = doc["classes"]
    assert cls["backend"] == "multi" and cls["store"] is None
    assert cls["audiences"] == ["vault", "sts.amazonaws.com"]
    assert [(f["path"], f.get("store")) for f in cls["files"]] == [
        ("db-password", "vault"),
        ("api-key", "aws"),
        ("app.env", None),
    ]
    vault, aws = cls["stores"]
    assert (vault["name"], vault["backend"], vault["audiences"]) == ("vault", "vault", ["vault"])
    assert vault["store"]["address"] == "https://vault:8200"
    assert vault["objects"] == [
        {"path": "db-password", "object": "objects[0].objectName", "fallback": None}
    ]
    assert vault["fallback_objects"] == [
        {"path": "api-key", "object": "objects[1].fallback.objectName"}
    ]
    assert aws["store"]["region"] == "eu-west-1" and aws["audiences"] == ["sts.amazonaws.com"]


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        (
            params([{**OBJECTS[0], "store": "vualt"}]),
            "objects[0].store: 'vualt' is not one of the class's stores (vault, aws)",
        ),
        (
            params([{k: v for k, v in OBJECTS[0].items() if k != "store"}]),
            "objects[0].store is required: the name of one of the class's stores (vault, aws)",
        ),
        (
            params(backend="vault"),
            "the class gives both backend and stores",
        ),
        (
            params(stores={**STORES, "aws": {"backend": "aws", "region": "eu west"}}),
            "store 'aws': region: 'eu west' is not a region name such as us-east-1",
        ),
        (
            params([OBJECTS[0], {**OBJECTS[1], "objectType": "ssm"}]),
            "store 'aws': objects[1]",
        ),
    ],
)
def test_check_errors(tmp_path: Path, parameters: dict[str, str], message: str) -> None:
    result = cli("check", spc(tmp_path, parameters))
    assert result.returncode == 1
    assert f"error: {message}" in result.stdout, result.stdout


def test_mount_reports_every_audience_the_csidriver_lacks(tmp_path: Path) -> None:
    csidriver = tmp_path / "csidriver.yaml"
    csidriver.write_text(
        yaml.safe_dump(
            {
                "kind": "CSIDriver",
                "spec": {
                    "podInfoOnMount": True,
                    "volumeLifecycleModes": ["Ephemeral"],
                    "tokenRequests": [{"audience": "vault"}],
                },
            }
        )
    )
    stores = {
        "one": {"backend": "fake", "audience": "vault"},
        "two": {"backend": "fake", "audience": "aud-two"},
        "three": {"backend": "fake", "audience": "aud-three"},
    }
    objects = [
        {"store": "one", "objectName": "a", "secretPath": "db-password"},
        {"store": "two", "objectName": "b", "secretPath": "db-password"},
        {"store": "three", "objectName": "c", "secretPath": "db-password"},
    ]
    token = tmp_path / "tok"
    token.write_text("jwt")
    result = cli(
        "mount",
        spc(tmp_path, params(objects, stores=stores)),
        "--target",
        str(tmp_path / "v"),
        "--enable-fake-backend",
        "--fake-store-file",
        str(EXAMPLES / "fake-store.yaml"),
        "--csidriver",
        str(csidriver),
        "--token",
        f"vault={token}",
    )
    assert result.returncode == 1
    assert (
        "kubelet: the CSIDriver's spec.tokenRequests lacks audiences the class needs pod tokens "
        "for: 'aud-two' (store 'two'), 'aud-three' (store 'three')"
    ) in result.stderr
    assert "FAILED_PRECONDITION" in result.stderr
