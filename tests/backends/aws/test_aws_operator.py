"""Issue 15: messages name what the class wrote. pathTranslation turns an objectAlias such as
`../../etc/passwd` into the file `.._.._etc_passwd`; a message about that object names the
alias as written too, so its author can find it."""

from __future__ import annotations

import pytest

from backends.aws.dialect import parse
from backends.aws.options import Options
from provider.core.errors import InvalidParameters
from provider.core.model import ParseContext

ONLINE = ParseContext(options=Options(region="us-east-1"))
OBJ = "objectName: db, objectType: secretsmanager"


def _error(objects: str) -> str:
    with pytest.raises(InvalidParameters) as info:
        parse({"objects": objects}, ONLINE)
    return str(info.value)


def test_aws_rewritten_alias_is_reported_as_written() -> None:
    text = _error(
        f"- {{{OBJ}, objectAlias: ../../etc/passwd}}\n- {{{OBJ}, objectAlias: ../../etc/passwd}}"
    )
    assert "'../../etc/passwd'" in text, text
    assert "objects[0].objectAlias '../../etc/passwd'" in text, text
    assert "objects[1].objectAlias '../../etc/passwd'" in text, text


def test_aws_rewritten_jmes_alias_and_name_are_reported_as_written() -> None:
    text = _error(
        "- {objectName: prod/db, objectType: secretsmanager,"
        " jmesPath: [{path: a, objectAlias: prod/db}]}"
    )
    assert "objects[0].objectName 'prod/db'" in text, text
    assert "objects[0].jmesPath[0].objectAlias 'prod/db'" in text, text


def test_aws_field_names_the_written_value_only_when_rewritten() -> None:
    plan = parse({"objects": f"- {{{OBJ}, objectAlias: ../../etc/passwd}}"}, ONLINE)
    [spec] = plan.objects
    assert spec.name == ".._.._etc_passwd"  # upstream's translation, unchanged
    assert spec.field == "objects[0].objectAlias '../../etc/passwd'"
    plain = parse({"objects": f"- {{{OBJ}, objectAlias: db.json}}"}, ONLINE)
    assert plain.objects[0].field == "objects[0].objectAlias"
