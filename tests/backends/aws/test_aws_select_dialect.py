"""AWS `select` entries as the class parser reads them: the selection refs, and one clear line
per bad key."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from backends.aws.options import Options
from backends.aws.refs import AwsSelection
from provider.core.errors import InvalidParameters
from provider.mount.planning import MountPlan, parse_plan
from tests.backends.aws.conftest import REGION


def plan(*selectors: Any, objects: str = "") -> MountPlan:
    params = {"backend": "aws", "select": yaml.safe_dump(list(selectors))}
    if objects:
        params["objects"] = objects
    return parse_plan(
        params,
        options_for=lambda _n: Options(region=REGION),
        enable_test_stores=False,
        max_objects=7,
    )


def test_selectors_become_selection_refs_without_any_listed_object() -> None:
    parsed = plan(
        {"namePrefix": "app/", "tags": {"team": "pay", "pci": None}, "directory": "app"},
        {"objectType": "ssmparameter", "path": "/cfg/", "recursive": "true", "directory": "c"},
    )
    first, second = (spec.ref for spec in parsed.objects)
    assert first == AwsSelection(
        "secretsmanager", "app/", (("pci", None), ("team", "pay")), limit=7
    )
    assert second == AwsSelection("ssm", "/cfg", recursive=True, limit=7)
    assert first.describe() == "secretsmanager namePrefix 'app/' tags {pci, team=pay}"
    assert second.describe() == "ssm path '/cfg' (recursive)"
    assert [spec.transforms.optional for spec in parsed.objects] == [True, True]
    assert hash(first) == hash(AwsSelection("secretsmanager", "app/", first.tags, limit=7))


def test_jmespath_files_are_optional_with_their_object() -> None:
    objects = yaml.safe_dump(
        [
            {
                "objectName": "db",
                "objectType": "secretsmanager",
                "optional": True,
                "jmesPath": [{"path": "u", "objectAlias": "user"}],
            }
        ]
    )
    parsed = plan(objects=objects)
    assert {s.name: s.transforms.optional for s in parsed.objects} == {"db": True, "user": True}


BAD = [
    ({"objectType": "kms", "namePrefix": "a"}, r"select\[0\]\.objectType: expected"),
    ({"directory": "d"}, r"select\[0\]: a secretsmanager selector needs namePrefix, tags"),
    ({"namePrefix": "!app"}, r"select\[0\]\.namePrefix: '!app' has characters"),
    ({"namePrefix": "a" * 513}, r"namePrefix: 513 characters, over AWS's 512"),
    ({"tags": ["team"]}, r"select\[0\]\.tags: expected a map"),
    ({"tags": {f"k{i}": "v" for i in range(51)}}, r"tags: 51 tags, over AWS's 50"),
    ({"tags": {"k" * 129: "v"}}, r"the tag key 'k+' is not a string of 1 to 128"),
    ({"tags": {"t": 3}}, r"select\[0\]\.tags\.t: expected a string \(quote it"),
    ({"tags": {"t": "a,b"}}, r"tags\.t: the value 'a,b' .* cannot filter on"),
    ({"tags": {"tëam": "x"}}, r"the tag key 'tëam' has characters ListSecrets cannot filter"),
    ({"namePrefix": "a/", "path": "/x"}, r"select\[0\]\.path: only an ssmparameter selector"),
    ({"objectType": "ssmparameter"}, r"select\[0\]\.path"),
    ({"objectType": "ssmparameter", "path": "app"}, r"path: 'app' is not a parameter path"),
    ({"objectType": "ssmparameter", "path": "/a//b"}, r"path: '/a//b' is not a parameter"),
    (
        {"objectType": "ssmparameter", "path": "/a", "tags": {"t": "x"}},
        r"select\[0\]\.tags: only a secretsmanager selector",
    ),
    (
        {"objectType": "ssmparameter", "path": "/a", "recursive": "yes"},
        r"select\[0\]\.recursive: expected",
    ),
    ({"prefix": "a/", "namePrefix": "a/"}, r"select\[0\]\.prefix is not a parameter"),
]


@pytest.mark.parametrize(("entry", "message"), BAD)
def test_bad_selector_keys_are_refused_one_line_each(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidParameters, match=message):
        plan(entry)
