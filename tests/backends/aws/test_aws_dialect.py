"""The AWS dialect parser: upstream's SecretProviderClasses, and every rule of its descriptor."""

from __future__ import annotations

import pytest

from backends.aws.dialect import KEYS, AwsRef, AwsStore, Target, parse
from backends.aws.options import Options, endpoint_map
from provider.core.errors import InvalidParameters
from provider.core.model import ParseContext, Transforms

ONLINE = ParseContext(options=Options(region="us-east-1"))
OFFLINE = ParseContext()
ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:MySecret-a1b2c3"
FAILOVER_ARN = "arn:aws:secretsmanager:us-east-2:123456789012:secret:MySecret-d4e5f6"


def test_aws_documented_class_parses_with_only_backend_added() -> None:
    # The upstream README's example class (failover, jmesPath, ARNs, SSM), as it is.
    parameters = {
        "backend": "aws",
        "region": "us-east-1",
        "failoverRegion": "us-east-2",
        "objects": f"""
            - objectName: "MySecret"
              objectType: "secretsmanager"
              jmesPath:
                  - path: "username"
                    objectAlias: "MySecretUsername"
                  - path: "password"
                    objectAlias: "MySecretPassword"
            - objectName: "{ARN}"
              failoverObject:
                objectName: "{FAILOVER_ARN}"
              objectAlias: testArn
            - objectName: "/my/parameter"
              objectType: "ssmparameter"
              objectVersionLabel: "prod"
              filePermission: "0600"
        """,
    }
    assert "backend" not in KEYS  # the core dispatches on it and strips nothing else
    plan = parse(parameters, ONLINE)
    names = [spec.name for spec in plan.objects]
    assert names == ["MySecret", "MySecretUsername", "MySecretPassword", "testArn", "_my_parameter"]
    assert plan.store == AwsStore("us-east-1", "us-east-2")
    specs = {spec.name: spec for spec in plan.objects}
    assert specs["MySecret"].ref is specs["MySecretPassword"].ref
    assert specs["MySecretUsername"].transforms == Transforms(extract="username", parse_as="json")
    assert specs["testArn"].ref == AwsRef("secretsmanager", Target(ARN), Target(FAILOVER_ARN))
    assert specs["_my_parameter"].ref == AwsRef("ssm", Target("/my/parameter", label="prod"))
    assert specs["_my_parameter"].mode == 0o600
    assert plan.warnings == ()


def test_aws_region_default_and_offline_warning() -> None:
    objects = "- {objectName: a, objectType: secretsmanager}"
    assert parse({"objects": objects}, ONLINE).store.region == "us-east-1"  # type: ignore[attr-defined]
    offline = parse({"objects": objects}, OFFLINE)
    assert any("region" in w for w in offline.warnings)
    with pytest.raises(InvalidParameters, match=r"region is required.*--aws-region"):
        parse({"objects": objects}, ParseContext(options=Options()))


@pytest.mark.parametrize(
    ("translation", "name", "expected"),
    [
        ("", "/a/b/c", "_a_b_c"),
        ("-", "a/b", "a-b"),
        ("False", "/a/b", "a/b"),
        ("false", "a/b", "a/b"),
    ],
)
def test_aws_path_translation(translation: str, name: str, expected: str) -> None:
    parameters = {
        "pathTranslation": translation,
        "objects": f"- {{objectName: '{name}', objectType: ssmparameter}}",
    }
    assert parse(parameters, ONLINE).objects[0].name == expected


def test_aws_ssm_version_and_our_extensions() -> None:
    plan = parse(
        {
            "usePodIdentity": "True",
            "preferredAddressType": "IPv6",
            "objects": """
              - {objectName: p, objectType: ssmparameter, objectVersion: "3", decode: base64}
              - {objectName: s, objectType: secretsmanager, extract: a.b, file: "false"}
            """,
        },
        ONLINE,
    )
    store = plan.store
    assert isinstance(store, AwsStore)
    assert store.use_pod_identity and store.address_type == "ipv6"
    p, s = plan.objects
    assert p.ref == AwsRef("ssm", Target("p", version="3"))
    assert p.transforms.decode == "base64"
    assert s.transforms.extract == "a.b" and s.transforms.file is False


OBJ = "objectName: x, objectType: secretsmanager"

BAD = [
    # (top-level parameters, objects, the field or phrase the message must name)
    ({}, "", "objects is required"),
    ({}, "- {objectType: secretsmanager}", "objects[0].objectName is required"),
    ({}, "{a: 1}", "objects: expected a YAML list"),
    ({}, "- just-a-string", "objects[0]: expected a map"),
    ({}, "- {objectName: x}", "objects[0].objectName: 'x' is not an ARN, so objectType"),
    ({}, "- {objectName: x, objectType: ssm}", "objects[0].objectType: expected"),
    ({}, "- {objectName: x, objectType: kms}", "objects[0].objectType: expected"),
    ({}, "- {objectName: 'arn:aws:secretsmanager'}", "is not a valid ARN"),
    ({}, "- {objectName: 'arn:aws:kms:us-east-1:1:key/k'}", "ARN service 'kms'"),
    (
        {},
        "- {objectName: 'arn:aws:secretsmanager:eu-west-1:1:secret:s'}",
        "region 'eu-west-1' must match",
    ),
    ({}, f"- {{objectName: '{ARN}', objectType: ssmparameter}}", "does not match the ARN"),
    (
        {},
        "- {objectName: p, objectType: ssmparameter, objectVersion: '1', objectVersionLabel: l}",
        "objects[0]: an SSM parameter takes objectVersion or objectVersionLabel, not both",
    ),
    ({}, f"- {{{OBJ}, filePermission: 0644}}", "objects[0].filePermission: expected four octal"),
    ({}, f"- {{{OBJ}, filePermission: '644'}}", "objects[0].filePermission"),
    ({}, f"- {{{OBJ}, filePermission: '0999'}}", "objects[0].filePermission"),
    ({}, f"- {{{OBJ}, filePermission: '1777'}}", "special bits"),
    (
        {"pathTranslation": "False"},
        f"- {{{OBJ}, objectAlias: 'a/../x'}}",
        "objects[0]: file name 'a/../x' may not contain '../'",
    ),
    ({}, f"- {{{OBJ}, objectTemplate: x}}", "objects[0].objectTemplate is not supported"),
    ({}, f"- {{{OBJ}, objectname: x}}", "'objectName' and 'objectname' are one key"),
    ({}, f"- {{{OBJ}, jmesPath: {{path: a}}}}", "objects[0].jmesPath: expected a YAML list"),
    ({}, f"- {{{OBJ}, jmesPath: [{{objectAlias: a}}]}}", "objects[0].jmesPath[0].path is required"),
    ({}, f"- {{{OBJ}, jmesPath: [{{path: a}}]}}", "jmesPath[0].objectAlias is required"),
    ({}, f"- {{{OBJ}, jmesPath: [{{path: 'a-b', objectAlias: b}}]}}", "jmesPath[0].path: invalid"),
    (
        {},
        f"- {{{OBJ}, jmesPath: [{{path: a, objectAlias: b, filePermission: '9'}}]}}",
        "jmesPath[0].filePermission",
    ),
    ({}, f"- {{{OBJ}, extract: 'a-b'}}", "objects[0].extract: invalid JMESPath"),
    ({}, f"- {{{OBJ}, decode: rot13}}", "objects[0].decode"),
    (
        {"failoverRegion": "us-east-2"},
        f"- {{{OBJ}, failoverObject: {{objectName: y}}}}",
        "objects[0].objectAlias is required with failoverObject",
    ),
    (
        {},
        f"- {{{OBJ}, objectAlias: a, failoverObject: {{objectName: y}}}}",
        "needs the failoverRegion",
    ),
    (
        {"failoverRegion": "us-east-2"},
        f"- {{{OBJ}, objectAlias: a, failoverObject: {{objectVersion: v}}}}",
        "objects[0].failoverObject.objectName is required",
    ),
    (
        {"failoverRegion": "us-east-2"},
        f"- {{{OBJ}, objectAlias: a, objectVersion: v1, failoverObject: {{objectName: y}}}}",
        "failoverObject.objectVersion must match objectVersion",
    ),
    (
        {"failoverRegion": "us-east-2"},
        f"- {{{OBJ}, objectAlias: a, failoverObject: {{objectName: '{ARN}'}}}}",
        "failoverObject.objectName: the ARN's region 'us-east-1' must match",
    ),
    ({}, f"- {{{OBJ}}}\n- {{{OBJ}}}", "file name 'x' is used by objects[0].objectName, objects[1]"),
    (
        {},
        f"- {{{OBJ}, objectAlias: a}}\n- {{{OBJ}, objectAlias: a, objectVersionLabel: L}}",
        "file name 'a' is used",
    ),
    (
        {},
        f"- {{{OBJ}, jmesPath: [{{path: a, objectAlias: x}}]}}",
        "file name 'x' is used by objects[0].objectName, objects[0].jmesPath[0].objectAlias",
    ),
    ({"region": "US East"}, f"- {{{OBJ}}}", "region: 'US East' is not a region name"),
    ({"failoverRegion": "us-east-1"}, f"- {{{OBJ}}}", "failoverRegion: 'us-east-1' is the primary"),
    ({"pathTranslation": "--"}, f"- {{{OBJ}}}", "pathTranslation: expected one character"),
    ({"usePodIdentity": "yes"}, f"- {{{OBJ}}}", "usePodIdentity: expected"),
    ({"preferredAddressType": "ipv5"}, f"- {{{OBJ}}}", "preferredAddressType: expected"),
    ({"roleArn": "my-role"}, f"- {{{OBJ}}}", "roleArn: 'my-role' is not an IAM role ARN"),
    (
        {"roleArn": "arn:aws:iam::123456789012:role/r", "usePodIdentity": "true"},
        f"- {{{OBJ}}}",
        "roleArn and usePodIdentity are both set",
    ),
    ({"joinName": "all"}, f"- {{{OBJ}}}", "joinName is not supported"),
]


@pytest.mark.parametrize(("top", "objects", "message"), BAD)
def test_aws_malformed_parameters(top: dict[str, str], objects: str, message: str) -> None:
    with pytest.raises(InvalidParameters) as caught:
        parse({"region": "us-east-1", **top, "objects": objects}, ONLINE)
    assert message in str(caught.value)


def test_aws_every_problem_is_reported_at_once() -> None:
    objects = """
      - {objectName: a}
      - {objectName: b, objectType: secretsmanager, filePermission: '12'}
      - {objectName: c, objectType: bogus}
    """
    with pytest.raises(InvalidParameters) as caught:
        parse({"objects": objects, "pathTranslation": "ab"}, ONLINE)
    problems = caught.value.problems
    assert len(problems) == 4
    assert any(p.startswith("pathTranslation") for p in problems)
    assert any("objects[0]" in p for p in problems)
    assert any("objects[1].filePermission" in p for p in problems)
    assert any("objects[2].objectType" in p for p in problems)


def test_aws_failover_object_inherits_the_label() -> None:
    plan = parse(
        {
            "failoverRegion": "us-east-2",
            "objects": f"""
              - {{{OBJ}, objectAlias: a, objectVersionLabel: L,
                 failoverObject: {{objectName: y}}}}
              - {{{OBJ}, objectAlias: b, objectVersionLabel: L,
                 failoverObject: {{objectName: y, objectVersionLabel: M}}}}
            """,
        },
        ONLINE,
    )
    first, second = (spec.ref for spec in plan.objects)
    assert isinstance(first, AwsRef) and isinstance(second, AwsRef)
    assert first.target(1) == Target("y", label="L")
    assert second.target(1) == Target("y", label="M")
    assert first.target(0) == Target("x", label="L")


def test_aws_bad_object_type_is_reported_once() -> None:
    objects = "- {objectName: x, objectType: kms, objectAlias: a, failoverObject: {objectName: y}}"
    with pytest.raises(InvalidParameters) as caught:
        parse({"failoverRegion": "us-east-2", "objects": objects}, ONLINE)
    assert caught.value.problems == [
        "objects[0].objectType: expected secretsmanager or ssmparameter, got 'kms'"
    ]


def test_aws_unknown_top_level_keys_are_left_to_the_core() -> None:
    plan = parse(
        {"objects": f"- {{{OBJ}}}", "csi.storage.k8s.io/pod.name": "p", "typo": "x"}, ONLINE
    )
    assert [spec.name for spec in plan.objects] == ["x"]


def test_aws_same_name_twice_with_distinct_files_is_fine() -> None:
    plan = parse(
        {
            "objects": f"""
              - {{{OBJ}}}
              - {{{OBJ}, objectAlias: prev, objectVersionLabel: AWSPREVIOUS}}
            """
        },
        ONLINE,
    )
    assert [spec.name for spec in plan.objects] == ["x", "prev"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("us-east-1", "is not region=http"),
        ("us-east-1=localhost:5000", "is not region=http"),
        ("a=http://x,a=http://y", "listed twice"),
    ],
)
def test_aws_endpoint_flag_is_validated(text: str, message: str) -> None:
    with pytest.raises(InvalidParameters, match="--aws-endpoints") as caught:
        endpoint_map(text)
    assert message in str(caught.value)


def test_aws_endpoint_flag_parses() -> None:
    assert endpoint_map(" us-east-1=http://127.0.0.1:1 , eu-west-1=https://x ") == {
        "us-east-1": "http://127.0.0.1:1",
        "eu-west-1": "https://x",
    }
    assert endpoint_map(None) == {}


# Issue 32: no class parameter names an AWS endpoint (endpoints are the operator's
# --aws-endpoints); the regions become host name labels (botocore's endpoint rules), so nothing
# that would change a URL past the label gets through. KEYS is pinned so that a parameter added
# later is looked at here.
HOSTILE_LABELS = [
    "us-east-1?x=1",
    "us-east-1#",
    "evil.example",
    "x@evil.example",
    "us-east-1/x",
    "evil.example:443",
    "%2e%2e",
    "..",
    "us east 1",
    "us-east-1\\x",
    "us-\uff45ast-1",
    "-us-east-1",
]


def test_aws_no_parameter_is_an_endpoint() -> None:
    assert {
        "objects",
        "region",
        "failoverRegion",
        "pathTranslation",
        "usePodIdentity",
        "preferredAddressType",
        "roleArn",
        "assumeRoleArn",
        "assumeRoleExternalId",
        "assumeRoleDurationSeconds",
        "assumeRoleSessionTags",
    } == KEYS


@pytest.mark.parametrize("key", ["region", "failoverRegion"])
@pytest.mark.parametrize("value", HOSTILE_LABELS)
def test_aws_regions_cannot_carry_url_parts(key: str, value: str) -> None:
    params = {"region": "us-east-1", "objects": f"- {{{OBJ}}}", key: value}
    with pytest.raises(InvalidParameters) as info:
        parse(params, ONLINE)
    assert f"{key}: " in str(info.value) and "is not a region name" in str(info.value)


@pytest.mark.parametrize(
    "arn",
    [
        "arn:aws:iam::111122223333:role/app?x=1",
        "arn:aws:iam::111122223333:role/app#",
        "arn:aws:iam::111122223333:role/a%2fb",
        "arn:aws:iam::111122223333:role/a b",
        "https://sts.evil.example/",
    ],
)
@pytest.mark.parametrize("key", ["roleArn", "assumeRoleArn"])
def test_aws_role_arn_is_an_arn_not_a_url(arn: str, key: str) -> None:
    with pytest.raises(InvalidParameters, match=rf"^{key}: .* is not an IAM role ARN"):
        parse({"region": "us-east-1", "objects": f"- {{{OBJ}}}", key: arn}, ONLINE)
