"""The AWS provider's dialect (aws/secrets-store-csi-driver-provider-aws v3), plus `roleArn`.

parameters:
  backend: aws
  region: us-east-1               # default: --aws-region / AWS_REGION
  failoverRegion: us-east-2       # read there when the primary region is unreachable
  pathTranslation: "_"            # one character, or "False"
  usePodIdentity: "true"          # EKS Pod Identity instead of IRSA
  preferredAddressType: ipv4      # Pod Identity agent address: auto | ipv4 | ipv6
  roleArn: arn:aws:iam::111122223333:role/app   # ours; default: the SA annotation
  assumeRoleArn: arn:aws:iam::444455556666:role/secrets   # then assume this role (upstream PR #555)
  assumeRoleExternalId: team-a-7f3c         # sent with it (upstream PR #555); shown nowhere
  assumeRoleDurationSeconds: "3600"         # 900..3600 (upstream PR #555)
  assumeRoleSessionTags: "{team: payments}" # ours: session tags (needs sts:TagSession)
  objects: |
    - objectName: MySecret
      objectType: secretsmanager  # or ssmparameter; optional for an ARN
      objectAlias: db.json
      objectVersion / objectVersionLabel / filePermission: "0400"
      jmesPath: [{path: '"db-password"', objectAlias: password, filePermission: "0400"}]
      failoverObject: {objectName: ..., objectVersion: ..., objectVersionLabel: ...}
  select: |                       # ours: every secret by name prefix and tags, or SSM path
    - namePrefix: app/
      tags: {team: payments}
    - {objectType: ssmparameter, path: /app/config, recursive: true, directory: config}

Every rule of the upstream descriptor applies; where upstream stops at the first problem, we
collect them all. Each jmesPath entry becomes its own ObjectSpec sharing the object's `ref`, so
one read serves the whole secret and every extracted file. The assumeRole* keys are parsed in
backends/aws/roles.py, the `select` entries in backends/aws/selectors.py.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping

from backends.aws.descriptors import OBJECTS, parse_object
from backends.aws.options import Options
from backends.aws.refs import AwsRef, AwsSelection, AwsStore, Ref, Service, Target
from backends.aws.roles import ASSUME_KEYS, ROLE_ARN, parse_assume_role
from backends.aws.selectors import SELECT_KEYS, selection
from provider.core.changes import Subject
from provider.core.model import ParseContext, StorePlan
from provider.core.parsing import Problems, go_bool, parse_objects, plain_secrets

__all__ = [
    "KEYS",
    "SELECT_KEYS",
    "AwsRef",
    "AwsSelection",
    "AwsStore",
    "Ref",
    "Target",
    "audiences",
    "change_name",
    "lifetime",
    "listed",
    "parse",
    "selection",
    "subject",
]

KEYS = frozenset(
    {
        "objects",
        "region",
        "failoverRegion",
        "pathTranslation",
        "usePodIdentity",
        "preferredAddressType",
        "roleArn",
        *ASSUME_KEYS,
    }
)
#: Upstream keys (of forks and newer releases) we refuse by name rather than ignore.
REFUSED_KEYS = {"joinName": "use the top-level 'templates' parameter to join objects"}
# Upstream passes any region name to the SDK (its tests use "fakeRegion"); the name becomes a
# host name label, so what botocore itself accepts (its validate_region_name) is let through.
_REGION = re.compile(r"^[a-zA-Z0-9](?:[a-zA-Z0-9\-]{0,61}[a-zA-Z0-9])?$")


def parse(params: Mapping[str, str], ctx: ParseContext[Options]) -> StorePlan[AwsStore, Ref]:
    problems = Problems(strict=ctx.strict)
    for key, hint in REFUSED_KEYS.items():
        if params.get(key):
            problems.add(f"{key} is not supported by secrets-bridge; {hint}")
    store = _parse_store(params, ctx, problems)
    translate = _parse_translation(params.get("pathTranslation", ""), problems)
    # A class may take all its files from `select` (backends/aws/selectors.py).
    entry = functools.partial(parse_object, store=store, translate=translate, problems=problems)
    specs = parse_objects(params.get("objects", ""), OBJECTS, entry, ctx, problems)
    problems.raise_if_any()
    return StorePlan("aws", store, tuple(specs), tuple(problems.warnings))


def _parse_store(
    params: Mapping[str, str], ctx: ParseContext[Options], problems: Problems
) -> AwsStore:
    region = params.get("region", "").strip()
    if not region:
        region = ((ctx.options.region if ctx.options else None) or "").strip()
    if not region:
        message = (
            "region is required: set parameters.region or start the provider with "
            "--aws-region (or AWS_REGION)"
        )
        if ctx.offline:
            problems.warn(message + " (not checked offline: the provider may have a default)")
        else:
            problems.add(message)
    elif not _REGION.match(region):
        problems.add(f"region: {region!r} is not a region name such as us-east-1")
    failover = params.get("failoverRegion", "").strip()
    if failover and not _REGION.match(failover):
        problems.add(f"failoverRegion: {failover!r} is not a region name such as us-east-2")
    if failover and failover == region:
        problems.add(f"failoverRegion: {failover!r} is the primary region; name another region")
    role_arn = params.get("roleArn", "").strip()
    if role_arn and not ROLE_ARN.match(role_arn):
        problems.add(
            f"roleArn: {role_arn!r} is not an IAM role ARN (arn:aws:iam::111122223333:role/name)"
        )
    # Go's strconv.ParseBool on the untrimmed value, as upstream (server.go).
    use_pod_identity = go_bool(params.get("usePodIdentity", ""), "usePodIdentity", problems)
    if use_pod_identity and role_arn:
        problems.add(
            "roleArn and usePodIdentity are both set: EKS Pod Identity chooses the role "
            "from its association; remove one"
        )
    address = params.get("preferredAddressType", "").strip().lower() or "auto"
    if address not in ("auto", "ipv4", "ipv6"):
        problems.add(
            f"preferredAddressType: expected auto, ipv4 or ipv6, got "
            f"{params['preferredAddressType']!r}"
        )
        address = "auto"
    assume_role = parse_assume_role(params, role_arn, problems)
    return AwsStore(region, failover, role_arn, use_pod_identity, address, assume_role)  # type: ignore[arg-type]


def _parse_translation(text: str, problems: Problems) -> str | None:
    """The character replacing '/' in file names; None means translation is off."""
    if text == "":
        return "_"
    if text.lower() == "false":
        return None
    if len(text) != 1:
        problems.add(f'pathTranslation: expected one character or "False", got {text!r}')
        return "_"
    return text


def audiences(store: AwsStore) -> tuple[str, ...]:
    """The audience of the pod token a mount of this class needs (`check --json`); the same
    values as backends/aws/auth.py logs in with."""
    return ("pods.eks.amazonaws.com",) if store.use_pod_identity else ("sts.amazonaws.com",)


#: Its answers are plain secrets: no lease, no certificate issued per read (`check`).
lifetime = plain_secrets


#: The object entries of a class of several stores, as this dialect's `objects`.
listed = OBJECTS.listed


# A full ARN ends in '-' and six random characters after the name (a partial ARN does not, and
# AWS itself reads a partial ARN whose name ends so as a full one: the same rule here).
_ARN_SUFFIX = re.compile(r"-[A-Za-z0-9]{6}$")


def change_name(service: Service, name: str) -> str:
    """The change feed's name of a secret or parameter, given by name or ARN: `sm:<name>` for
    Secrets Manager (an ARN's random suffix dropped, so a secret deleted and created again is the
    same name), `ssm:<name>` for SSM without its leading '/' (`/app/db`, `app/db` and
    `arn:...:parameter/app/db` are one name; at worst two parameters share it: over-matching).
    backends/aws/changes.py names events with it."""
    if service == "ssm":
        if name.startswith("arn:"):
            name = name.split(":", 5)[-1].removeprefix("parameter")
        return "ssm:" + name.lstrip("/")
    if name.startswith("arn:"):
        name = _ARN_SUFFIX.sub("", name.split(":", 6)[-1])
    return "sm:" + name


def subject(store: AwsStore, ref: Ref) -> Subject:
    """What the change feed calls `ref` (provider/core/changes.py): its name in the class's
    primary region. A selection is a prefix: its namePrefix (`sm:` alone for tags only: tag
    changes arrive as events of the secret), or its path with a trailing '/' (a one-level
    path over-matches its deeper parameters)."""
    if isinstance(ref, AwsRef):
        return Subject.of(store.region, change_name(ref.service, ref.primary.name))
    if ref.service == "secretsmanager":
        return Subject.of(store.region, change_name("secretsmanager", ref.prefix), prefix=True)
    path = change_name("ssm", ref.prefix).rstrip("/")
    return Subject.of(store.region, path if path == "ssm:" else path + "/", prefix=True)
