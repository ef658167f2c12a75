"""A selected AWS secret is named in the audit trail as the same secret listed is (issue 40,
item 8): its selector's reference has no `*` to fill, so the selection names its members."""

from __future__ import annotations

from backends.aws.refs import AwsSelection
from provider.mount.auditing import naming


def test_a_selected_secrets_manager_secret_is_named_by_its_whole_name() -> None:
    name = naming(AwsSelection(service="secretsmanager", prefix="app/"))
    assert name("db") == "secretsmanager app/db"


def test_a_selected_parameter_is_named_by_its_path() -> None:
    assert naming(AwsSelection(service="ssm", prefix="/app/"))("db/user") == "ssm /app/db/user"
    assert naming(AwsSelection(service="ssm", prefix="/app"))("db") == "ssm /app/db"
