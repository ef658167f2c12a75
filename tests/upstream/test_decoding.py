"""How the dialects decode objects beyond the upstream rows: unknown keys (a warning, or an error
under --strict-parameters, logged once per class by serve), Go's ParseBool, AWS key case, and
the object version ids each upstream provider reports."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from devkit.testing import Harness
from provider.cli.main import build_parser, settings_from_args
from provider.core.errors import InvalidParameters
from provider.mount.planning import parse_plan

AZURE = {"keyvaultName": "kv1", "tenantID": "t"}

#: A class per dialect whose first object carries the unknown key `objectAliass`.
TYPO_CLASSES: dict[str, tuple[dict[str, str], str]] = {
    "vault": (
        {"roleName": "r", "objects": "- {objectName: a, secretPath: s/a, objectAliass: x}"},
        "objects[0].objectAliass is not a parameter of a vault object (objectName 'a')",
    ),
    "aws": (
        {
            "region": "us-east-1",
            "objects": "- {objectName: a, objectType: secretsmanager, objectAliass: x}",
        },
        "objects[0].objectAliass is not a parameter of an AWS object (objectName 'a')",
    ),
    "gcp": (
        {"secrets": "- {resourceName: projects/p/secrets/a/versions/1, path: a, pth: x}"},
        "secrets[0].pth is not a parameter of a gcp secrets entry (resourceName ",
    ),
    "azure": (
        {
            **AZURE,
            "objects": "array:\n  - |\n    objectName: a\n    objectType: secret\n"
            "    objectAliass: x\n",
        },
        "objects.array[0].objectAliass is not a parameter of an Azure Key Vault object "
        "(objectName 'a')",
    ),
}
NEAREST = {
    "vault": "'objectName'",
    "aws": "'objectAlias'",
    "gcp": "'path'",
    "azure": "'objectAlias'",
}


@pytest.mark.parametrize("dialect", sorted(TYPO_CLASSES))
def test_unknown_object_key_warns_as_upstream_drops_it(dialect: str) -> None:
    params, fragment = TYPO_CLASSES[dialect]
    plan = parse_plan({**params, "backend": dialect}, options_for=None, enable_test_stores=False)
    (warning,) = [w for w in plan.warnings if fragment in w]
    assert "is ignored, as upstream ignores it" in warning
    assert f"the nearest known key is {NEAREST[dialect]}" in warning


@pytest.mark.parametrize("dialect", sorted(TYPO_CLASSES))
def test_strict_parameters_refuses_unknown_object_keys(dialect: str) -> None:
    params, fragment = TYPO_CLASSES[dialect]
    with pytest.raises(InvalidParameters) as err:
        parse_plan(
            {**params, "backend": dialect}, options_for=None, enable_test_stores=False, strict=True
        )
    (problem,) = [p for p in err.value.problems if fragment in p]
    assert "--strict-parameters" in problem and NEAREST[dialect] in problem


async def test_serve_logs_the_warning_once_per_class(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    harness = Harness(tmp_path)
    harness.write({"secrets": {"a": "1"}})
    objects: list[dict[str, Any]] = [{"objectName": "a", "colour": "red"}]
    with caplog.at_level(logging.WARNING, logger="secrets_bridge.mounting"):
        for _ in range(3):
            assert await harness.files(objects) == {"a": b"1"}
    logged = [r for r in caplog.records if r.getMessage() == "class parameters need attention"]
    assert len(logged) == 1
    (warning,) = logged[0].fields["warnings"]  # type: ignore[attr-defined]
    assert warning.startswith("objects[0].colour is not a parameter of a fake object")


async def test_serve_with_strict_parameters_refuses_the_mount(tmp_path: Path) -> None:
    harness = Harness(tmp_path, strict_parameters=True)
    harness.write({"secrets": {"a": "1"}})
    with pytest.raises(InvalidParameters, match=r"objects\[0\]\.colour .*--strict-parameters"):
        await harness.files([{"objectName": "a", "colour": "red"}])


@pytest.mark.parametrize(
    ("argv", "strict"),
    [
        (["serve"], False),
        (["serve", "--strict-parameters"], True),
        (["serve", "--no-strict-parameters"], False),
    ],
)
def test_strict_parameters_flag(argv: list[str], strict: bool) -> None:
    args = build_parser("serve").parse_args(argv)
    assert settings_from_args(args).core.strict_parameters is strict


GO_BOOLS = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True}
GO_BOOLS |= {"0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}


@pytest.mark.parametrize(("text", "value"), sorted(GO_BOOLS.items()))
def test_azure_switches_parse_like_go_parse_bool(text: str, value: bool) -> None:
    objects = "array:\n  - |\n    objectName: a\n    objectType: secret\n"
    plan = parse_plan(
        {**AZURE, "backend": "azure", "useVMManagedIdentity": f" {text} ", "objects": objects},
        options_for=None,
        enable_test_stores=False,
    )
    assert (plan.store.store.auth == "vm-managed-identity") is value


@pytest.mark.parametrize("text", ["yes", "on", "tRUE", "2", "y"])
def test_other_spellings_are_refused_as_upstream_refuses_them(text: str) -> None:
    with pytest.raises(InvalidParameters, match="useVMManagedIdentity: expected"):
        parse_plan(
            {**AZURE, "backend": "azure", "useVMManagedIdentity": text, "objects": "array: [a]"},
            options_for=None,
            enable_test_stores=False,
        )
    with pytest.raises(InvalidParameters, match="usePodIdentity: expected"):
        parse_plan(
            {"backend": "aws", "region": "r", "usePodIdentity": text, "objects": "- {}"},
            options_for=None,
            enable_test_stores=False,
        )


def test_aws_object_keys_match_ignoring_case_and_may_not_repeat() -> None:
    objects = (
        "- ObjectName: a\n  OBJECTTYPE: secretsmanager\n"
        "  JmesPath: [{Path: user, ObjectAlias: u}]\n"
    )
    plan = parse_plan(
        {"backend": "aws", "region": "us-east-1", "objects": objects},
        options_for=None,
        enable_test_stores=False,
    )
    assert [s.name for s in plan.store.objects] == ["a", "u"]
    assert plan.warnings == ()
    with pytest.raises(InvalidParameters, match="'objectName' and 'objectname' are one key"):
        parse_plan(
            {
                "backend": "aws",
                "region": "us-east-1",
                "objects": "- {objectName: a, objectname: b, objectType: secretsmanager}",
            },
            options_for=None,
            enable_test_stores=False,
        )


@pytest.mark.parametrize(
    ("params", "ids"),
    [
        # vault: objectName (the file name)
        (
            {"backend": "vault", "roleName": "r", "objects": "- {objectName: a, secretPath: s}"},
            ["a"],
        ),
        # aws: the file name, for the object and each jmesPath file
        (
            {
                "backend": "aws",
                "region": "us-east-1",
                "objects": "- {objectName: x/y, objectType: secretsmanager, "
                "jmesPath: [{path: k, objectAlias: k}]}",
            },
            ["x_y", "k"],
        ),
        # gcp: the resourceName as written
        (
            {
                "backend": "gcp",
                "secrets": "- {resourceName: projects/p/secrets/s/versions/latest, path: f}",
            },
            ["projects/p/secrets/s/versions/latest"],
        ),
        # azure: <objectType>/<objectName>, whatever the alias
        (
            {
                **AZURE,
                "backend": "azure",
                "objects": "array:\n  - |\n    objectName: s\n"
                "    objectType: cert\n    objectAlias: tls.crt\n",
            },
            ["cert/s"],
        ),
    ],
)
def test_object_version_ids_are_upstream_ones(params: dict[str, str], ids: list[str]) -> None:
    plan = parse_plan(params, options_for=None, enable_test_stores=False)
    assert [s.version_id or s.name for s in plan.store.objects] == ids


def test_check_audiences_are_the_ones_the_stores_log_in_with() -> None:
    from backends.aws import auth as aws_auth
    from backends.aws.dialect import AwsStore
    from backends.aws.dialect import audiences as aws_audiences
    from backends.azure import auth as azure_auth

    assert aws_audiences(AwsStore("r")) == (aws_auth.IRSA_AUDIENCE,)
    assert aws_audiences(AwsStore("r", use_pod_identity=True)) == (aws_auth.POD_IDENTITY_AUDIENCE,)
    assert azure_auth.AUDIENCE == "api://AzureADTokenExchange"
