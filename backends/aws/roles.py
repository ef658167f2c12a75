"""The assumeRole* parameters: a second role the class assumes after the pod's own login.

`assumeRoleArn`, `assumeRoleExternalId` and `assumeRoleDurationSeconds` are the names of the
upstream provider's pull request #555 (aws/secrets-store-csi-driver-provider-aws, open);
`assumeRoleSessionTags` is ours. One hop only: upstream assumes one role, and the cross-account
patterns of the EKS documentation (IRSA and Pod Identity) need one; a list of roles would be a
new key. Upstream ignores a bad duration with a warning; AWS would refuse it for a chained
session (900..3600 seconds), so it is refused here, with every other problem, at parse time.

The rules are AWS's own (STS AssumeRole): a role ARN of at most 2048 characters; an external
id of 2..1224 characters among `[\\w+=,.@:/-]`, never echoed (AWS does not call it a secret, but
it is the one shared value a confused deputy would need, so it stays out of messages and logs);
at most 50 session tags, keys of 1..128 and values of 0..256 characters among letters, digits,
spaces and `_.:/=+-@`, keys unique ignoring case and not starting with `aws:`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from backends.aws.refs import AssumeRole, Hidden
from provider.core.boundedyaml import load_yaml
from provider.core.errors import InvalidParameters
from provider.core.parsing import Problems, expect_str, shown

ARN_KEY = "assumeRoleArn"
EXTERNAL_ID_KEY = "assumeRoleExternalId"
DURATION_KEY = "assumeRoleDurationSeconds"
TAGS_KEY = "assumeRoleSessionTags"
ASSUME_KEYS = (ARN_KEY, EXTERNAL_ID_KEY, DURATION_KEY, TAGS_KEY)

ROLE_ARN = re.compile(r"^arn:[\w-]+:iam::\d{12}:role/[\w+=,.@/-]+$", re.ASCII)
MAX_ARN = 2048
_EXTERNAL_ID = re.compile(r"^[\w+=,.@:/-]{2,1224}$", re.ASCII)
#: A role chain's session lasts at most one hour; STS's floor is 15 minutes.
MIN_DURATION, MAX_DURATION = 900, 3600
MAX_TAGS, MAX_TAG_KEY, MAX_TAG_VALUE = 50, 128, 256
_TAG_TEXT = re.compile(r"^[\w .:/=+\-@]*$")


def parse_assume_role(
    params: Mapping[str, str], role_arn: str, problems: Problems
) -> AssumeRole | None:
    arn = params.get(ARN_KEY, "").strip()
    if not arn:
        given = [k for k in ASSUME_KEYS[1:] if params.get(k, "").strip()]
        if given:
            problems.add(
                f"{', '.join(given)} set without {ARN_KEY}: name the role to assume with the "
                "pod's credentials, or remove them"
            )
        return None
    _check_arn(arn, role_arn, problems)
    external_id = _external_id(params.get(EXTERNAL_ID_KEY, ""), problems)
    duration = _duration(params.get(DURATION_KEY, "").strip(), problems)
    tags = _tags(params.get(TAGS_KEY, ""), problems)
    return AssumeRole(arn, external_id, tags, duration)


def _check_arn(arn: str, role_arn: str, problems: Problems) -> None:
    if arn.count("arn:") > 1:
        problems.add(
            f"{ARN_KEY}: one role ARN, got several: secrets-bridge assumes one role after the "
            "pod's own (a chain of one hop)"
        )
    elif len(arn) > MAX_ARN or not ROLE_ARN.match(arn):
        problems.add(
            f"{ARN_KEY}: {shown(arn)} is not an IAM role ARN "
            "(arn:aws:iam::444455556666:role/name, at most 2048 characters)"
        )
    elif arn == role_arn:
        problems.add(
            f"{ARN_KEY} names the role roleArn already logs in as: remove it, or name the "
            "role to assume next (the other account's)"
        )


def _external_id(value: str, problems: Problems) -> Hidden | None:
    if value == "":
        return None
    if not _EXTERNAL_ID.match(value):
        # Neither the value nor a part of it: a near miss of the real one would give it away.
        problems.add(
            f"{EXTERNAL_ID_KEY}: expected 2 to 1224 characters among letters, digits and "
            f"_+=,.@:/- (length {len(value)}; the value is not shown)"
        )
        return None
    return Hidden(value)


def _duration(text: str, problems: Problems) -> int:
    if text == "":
        return 0
    if text.isascii() and text.isdigit() and MIN_DURATION <= int(text) <= MAX_DURATION:
        return int(text)
    problems.add(
        f"{DURATION_KEY}: expected whole seconds from {MIN_DURATION} to {MAX_DURATION} "
        f"(AWS caps a chained role's session at one hour), got {shown(text, 40)}"
    )
    return 0


def _tags(text: str, problems: Problems) -> tuple[tuple[str, str], ...]:
    if not text.strip():
        return ()
    try:
        data = load_yaml(text, TAGS_KEY)
    except InvalidParameters as exc:
        problems.items.extend(exc.problems)
        return ()
    if not isinstance(data, dict):
        problems.add(
            f"{TAGS_KEY}: expected a map of tag keys to values, such as "
            f'"{{team: payments, env: prod}}", got {type(data).__name__}'
        )
        return ()
    if len(data) > MAX_TAGS:
        problems.add(f"{TAGS_KEY}: {len(data)} tags; AWS allows at most {MAX_TAGS} per session")
        return ()
    tags: dict[str, str] = {}
    seen: dict[str, str] = {}
    for raw_key, raw_value in data.items():
        key = expect_str(raw_key, f"{TAGS_KEY} key", problems)
        value = expect_str(raw_value, f"{TAGS_KEY}[{shown(key, 40)}]", problems)
        problem = _tag_problem(key, value)
        if problem:
            problems.add(f"{TAGS_KEY}[{shown(key, 40)}]: {problem}")
        elif key.lower() in seen:
            problems.add(
                f"{TAGS_KEY}: keys {shown(seen[key.lower()], 40)} and {shown(key, 40)} differ "
                "only in case; AWS treats them as one"
            )
        else:
            seen[key.lower()] = key
            tags[key] = value
    return tuple(sorted(tags.items()))


def _tag_problem(key: str, value: str) -> str:
    if not 1 <= len(key) <= MAX_TAG_KEY:
        return f"a key is 1 to {MAX_TAG_KEY} characters ({len(key)} given)"
    if key.lower().startswith("aws:"):
        return "keys starting with 'aws:' are AWS's own"
    if len(value) > MAX_TAG_VALUE:
        return f"a value is at most {MAX_TAG_VALUE} characters ({len(value)} given)"
    if not (_TAG_TEXT.match(key) and _TAG_TEXT.match(value)):
        return "keys and values take letters, digits, spaces and _.:/=+-@ only"
    return ""
