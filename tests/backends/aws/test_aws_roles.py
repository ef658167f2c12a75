"""The assumeRole* parameters (backends/aws/roles.py): what a class may ask for, refused in one
line each when it may not, and what `check --json` and a class of several stores show."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from backends.aws.dialect import parse
from backends.aws.options import Options
from backends.aws.refs import AssumeRole, Hidden
from provider.cli import check
from provider.core.errors import InvalidParameters
from provider.core.model import ParseContext
from provider.mount.planning import parse_plan

ONLINE = ParseContext(options=Options(region="us-east-1"))
ROLE_A = "arn:aws:iam::111122223333:role/app"
ROLE_B = "arn:aws:iam::444455556666:role/secrets"
EXTERNAL_ID = "team-a-7f3c-external"
BASE = {
    "region": "us-east-1",
    "roleArn": ROLE_A,
    "objects": "- {objectName: s, objectType: secretsmanager}",
}


def _problems(**extra: str) -> list[str]:
    with pytest.raises(InvalidParameters) as info:
        parse({**BASE, **extra}, ONLINE)
    return info.value.problems


def test_aws_assume_role_parameters_parse() -> None:
    plan = parse(
        {
            **BASE,
            "assumeRoleArn": ROLE_B,
            "assumeRoleExternalId": EXTERNAL_ID,
            "assumeRoleDurationSeconds": "3600",
            "assumeRoleSessionTags": "team: payments\nenv: prod\ncost-center: 42",
        },
        ONLINE,
    )
    role = plan.store.assume_role
    assert role == AssumeRole(
        ROLE_B,
        Hidden(EXTERNAL_ID),
        (("cost-center", "42"), ("env", "prod"), ("team", "payments")),
        3600,
    )
    assert plan.store.describe() == f"aws us-east-1 as {ROLE_A} then {ROLE_B}"
    assert EXTERNAL_ID not in repr(plan.store)
    # Without the key the class is as before.
    assert parse(BASE, ONLINE).store.assume_role is None


def test_aws_check_json_shows_the_chain_but_not_the_external_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spc = {
        "apiVersion": "secrets-store.csi.x-k8s.io/v1",
        "kind": "SecretProviderClass",
        "metadata": {"name": "cross-account"},
        "spec": {
            "provider": "secrets-bridge",
            "parameters": {
                "backend": "aws",
                **BASE,
                "assumeRoleArn": ROLE_B,
                "assumeRoleExternalId": EXTERNAL_ID,
                "assumeRoleSessionTags": "{team: payments}",
            },
        },
    }
    path = tmp_path / "spc.yaml"
    path.write_text(yaml.safe_dump(spc))
    assert check.run([str(path)], as_json=True) == check.EXIT_OK
    out = capsys.readouterr().out
    (report,) = json.loads(out)["classes"]
    chain = report["store"]["assume_role"]
    assert chain["role_arn"] == ROLE_B
    assert chain["session_tags"] == [["team", "payments"]]
    assert chain["external_id"].startswith("set (sha256:")
    assert EXTERNAL_ID not in out


def test_aws_assume_role_in_a_class_of_several_stores() -> None:
    stores = {
        "mine": {"backend": "aws", "region": "us-east-1", "roleArn": ROLE_A},
        "theirs": {
            "backend": "aws",
            "region": "us-east-1",
            "roleArn": ROLE_A,
            "assumeRoleArn": ROLE_B,
            "assumeRoleExternalId": EXTERNAL_ID,
            "assumeRoleSessionTags": "{team: payments}",
        },
    }
    objects = [
        {"store": "mine", "objectName": "local", "objectType": "secretsmanager"},
        {"store": "theirs", "objectName": "shared", "objectType": "secretsmanager"},
    ]
    params = {"stores": yaml.safe_dump(stores), "objects": yaml.safe_dump(objects)}
    plan = parse_plan(params, options_for=None, enable_test_stores=False)
    by_name = {named.name: named.plan.store for named in plan.stores}
    assert by_name["mine"].assume_role is None
    assert by_name["theirs"].assume_role.role_arn == ROLE_B
    stores["theirs"]["assumeRoleDurationSeconds"] = "7200"
    params["stores"] = yaml.safe_dump(stores)
    with pytest.raises(InvalidParameters) as info:
        parse_plan(params, options_for=None, enable_test_stores=False)
    (problem,) = info.value.problems
    assert problem.startswith("store 'theirs': assumeRoleDurationSeconds: expected whole seconds")


# One line each, naming the key, never echoing an external id or a whole hostile value.
HOSTILE = [
    ({"assumeRoleArn": "arn:aws:iam::1:role/x"}, "assumeRoleArn: 'arn:aws:iam::1:role/x' is not"),
    ({"assumeRoleArn": f"{ROLE_B},{ROLE_A}"}, "assumeRoleArn: one role ARN, got several"),
    ({"assumeRoleArn": f"{ROLE_B} {ROLE_B}"}, "assumeRoleArn: one role ARN, got several"),
    ({"assumeRoleArn": "arn:aws:iam::444455556666:role/" + "a" * 5000}, "is not an IAM role ARN"),
    ({"assumeRoleArn": "https://sts.evil.example/"}, "is not an IAM role ARN"),
    ({"assumeRoleArn": ROLE_A}, "assumeRoleArn names the role roleArn already logs in as"),
    ({"assumeRoleExternalId": EXTERNAL_ID}, "assumeRoleExternalId set without assumeRoleArn"),
    (
        {"assumeRoleArn": ROLE_B, "assumeRoleExternalId": "x"},
        "assumeRoleExternalId: expected 2 to 1224 characters",
    ),
    (
        {"assumeRoleArn": ROLE_B, "assumeRoleExternalId": "s3cret id with spaces"},
        "(length 21; the value is not shown)",
    ),
    (
        {"assumeRoleArn": ROLE_B, "assumeRoleExternalId": "x" * 5000},
        "(length 5000; the value is not shown)",
    ),
    ({"assumeRoleArn": ROLE_B, "assumeRoleDurationSeconds": "43200"}, "from 900 to 3600"),
    ({"assumeRoleArn": ROLE_B, "assumeRoleDurationSeconds": "899"}, "from 900 to 3600"),
    ({"assumeRoleArn": ROLE_B, "assumeRoleDurationSeconds": "1e3"}, "got '1e3'"),
    ({"assumeRoleArn": ROLE_B, "assumeRoleDurationSeconds": "９００"}, "from 900 to 3600"),
    (
        {"assumeRoleArn": ROLE_B, "assumeRoleSessionTags": "- team\n- prod"},
        "assumeRoleSessionTags: expected a map of tag keys to values",
    ),
    (
        {
            "assumeRoleArn": ROLE_B,
            "assumeRoleSessionTags": "{" + ", ".join(f"k{i}: v" for i in range(51)) + "}",
        },
        "assumeRoleSessionTags: 51 tags; AWS allows at most 50",
    ),
    (
        {
            "assumeRoleArn": ROLE_B,
            "assumeRoleSessionTags": "\n".join(f"k{i}: v" for i in range(20000)),
        },
        "assumeRoleSessionTags: ",
    ),
    (
        {"assumeRoleArn": ROLE_B, "assumeRoleSessionTags": "{" + "k" * 200 + ": v}"},
        "a key is 1 to 128 characters (200 given)",
    ),
    (
        {"assumeRoleArn": ROLE_B, "assumeRoleSessionTags": "{team: " + "v" * 300 + "}"},
        "assumeRoleSessionTags['team']: a value is at most 256 characters (300 given)",
    ),
    (
        {"assumeRoleArn": ROLE_B, "assumeRoleSessionTags": "{'aws:team': x}"},
        "keys starting with 'aws:' are AWS's own",
    ),
    (
        {"assumeRoleArn": ROLE_B, "assumeRoleSessionTags": "{team: 'a\\nb'}"},
        "letters, digits, spaces and _.:/=+-@ only",
    ),
    (
        {"assumeRoleArn": ROLE_B, "assumeRoleSessionTags": "{Team: a, team: b}"},
        "keys 'Team' and 'team' differ only in case",
    ),
    (
        {"assumeRoleArn": ROLE_B, "assumeRoleSessionTags": "{a: &x [1], b: *x}"},
        "assumeRoleSessionTags",
    ),
]


@pytest.mark.parametrize(("extra", "expected"), HOSTILE)
def test_aws_hostile_assume_role_parameters_are_refused_in_one_line(
    extra: dict[str, str], expected: str
) -> None:
    (problem,) = _problems(**extra)
    assert expected in problem
    assert len(problem) < 400 and "\n" not in problem
    assert EXTERNAL_ID not in problem and "s3cret" not in problem


def test_aws_assume_role_key_part_tells_every_difference() -> None:
    base = AssumeRole(ROLE_B, Hidden(EXTERNAL_ID), (("team", "a"),), 900)
    variants = [
        base,
        dataclasses.replace(base, role_arn=ROLE_A),
        dataclasses.replace(base, external_id=Hidden("other-id")),
        dataclasses.replace(base, external_id=None),
        dataclasses.replace(base, session_tags=(("team", "b"),)),
        dataclasses.replace(base, session_tags=()),
        dataclasses.replace(base, duration_seconds=0),
    ]
    parts = {v.key_part for v in variants}
    assert len(parts) == len(variants)
    assert all(EXTERNAL_ID not in p and "|" not in p for p in parts)
    assert base.key_part == AssumeRole(ROLE_B, Hidden(EXTERNAL_ID), (("team", "a"),), 900).key_part
