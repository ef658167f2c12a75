"""One entry of the AWS `objects` list (upstream's SecretDescriptor), with all its rules.

Rules from aws/secrets-store-csi-driver-provider-aws `provider/secret_descriptor.go`: a name or
ARN with a matching objectType, the ARN's region equal to the region it is read in, SSM objects
with objectVersion or objectVersionLabel (not both), jmesPath entries with path and objectAlias,
failoverObject only with objectAlias and failoverRegion and the same objectVersion, four-digit
octal filePermission, no '../' in file names. Each problem is reported with its field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from backends.aws.refs import AwsRef, AwsStore, Ref, Service, Target
from provider.core.model import ObjectSpec, Transforms
from provider.core.parsing import (
    ObjectList,
    Problems,
    check_jmespath,
    expect_list,
    expect_map,
    expect_str,
    fold_keys,
    parse_transforms,
    unknown_keys,
)

OBJECT_KEYS = frozenset(
    {
        "objectName",
        "objectType",
        "objectAlias",
        "objectVersion",
        "objectVersionLabel",
        "filePermission",
        "jmesPath",
        "failoverObject",
    }
)
REFUSED_OBJECT_KEYS = {"objectTemplate": "use the top-level 'templates' parameter instead"}
#: The `objects` list; upstream decodes it through encoding/json: keys match ignoring case.
OBJECTS = ObjectList(
    "an AWS object",
    OBJECT_KEYS,
    "objects is required: a YAML list of {objectName, objectType, ...}",
    unique="file name",
    refused=REFUSED_OBJECT_KEYS,
    fold=True,
)
JMES_KEYS = frozenset({"path", "objectAlias", "filePermission"})
FAILOVER_KEYS = frozenset({"objectName", "objectVersion", "objectVersionLabel"})

_TYPES: dict[str, Service] = {"secretsmanager": "secretsmanager", "ssmparameter": "ssm"}
_ARN_SERVICES: dict[str, Service] = {"secretsmanager": "secretsmanager", "ssm": "ssm"}
_MODE = re.compile(r"^[0-7]{4}$")
# Upstream's check, kept for parity: with pathTranslation "False" a name may carry '/'.
_BAD_PATH = re.compile(r"(/\.\./)|(^\.\./)|(/\.\.$)")


def parse_object(
    obj: Mapping[str, Any], where: str, store: AwsStore, translate: str | None, problems: Problems
) -> list[ObjectSpec[Ref]]:
    """One entry of `objects` (a map of known keys: parse_objects checked them)."""
    name = expect_str(obj.get("objectName"), f"{where}.objectName", problems, required=True)
    kind = expect_str(obj.get("objectType"), f"{where}.objectType", problems)
    alias = expect_str(obj.get("objectAlias"), f"{where}.objectAlias", problems)
    version = expect_str(obj.get("objectVersion"), f"{where}.objectVersion", problems)
    label = expect_str(obj.get("objectVersionLabel"), f"{where}.objectVersionLabel", problems)
    if not name:
        return []
    service = _service(name, kind, store.region, f"{where}.objectName", problems)
    _check_versions(service, version, label, where, problems)
    failover = _parse_failover(obj.get("failoverObject"), where, service, kind, store, problems)
    if failover is not None:
        if not alias:
            problems.add(f"{where}.objectAlias is required with failoverObject (the file name)")
        if failover.version != version:
            problems.add(
                f"{where}.failoverObject.objectVersion must match objectVersion "
                f"({failover.version!r} != {version!r}): both regions must hold the same version"
            )
        # Upstream reads the primary's label in the failover region unless one is given.
        failover = Target(failover.name, failover.version, failover.label or label)
    file_name = _file_name(alias or name, translate)
    field = _as_written(
        f"{where}.objectAlias" if alias else f"{where}.objectName", alias or name, file_name
    )
    if _BAD_PATH.search(file_name):
        problems.add(f"{where}: file name {file_name!r} may not contain '../'")
    mode = _parse_mode(obj.get("filePermission"), f"{where}.filePermission", problems)
    ref = AwsRef(service or "secretsmanager", Target(name, version, label), failover)
    transforms = parse_transforms(obj, where, problems)
    specs: list[ObjectSpec[Ref]] = [ObjectSpec(file_name, ref, mode, transforms, field)]
    jmes = expect_list(obj.get("jmesPath"), f"{where}.jmesPath", problems)
    for j, item in enumerate(jmes):
        where_j = f"{where}.jmesPath[{j}]"
        spec = _parse_jmes(item, where_j, ref, translate, transforms.optional, problems)
        if spec is not None:
            specs.append(spec)
    return specs


def _service(name: str, kind: str, region: str, field: str, problems: Problems) -> Service | None:
    """The object's service from objectType and/or its ARN, checking they agree."""
    declared = _TYPES.get(kind) if kind else None
    if kind and declared is None:
        problems.add(
            f"{field.rsplit('.', 1)[0]}.objectType: expected secretsmanager or ssmparameter, "
            f"got {kind!r}"
        )
    if not name.startswith("arn:"):
        if not kind:
            problems.add(
                f"{field}: {name!r} is not an ARN, so objectType is required "
                "(secretsmanager or ssmparameter)"
            )
        return declared
    parts = name.split(":", 5)
    if len(parts) < 6 or not all(parts[i] for i in (1, 2, 5)):
        problems.add(
            f"{field}: {name!r} is not a valid ARN (arn:partition:service:region:account:resource)"
        )
        return declared
    arn_service = _ARN_SERVICES.get(parts[2])
    if arn_service is None:
        problems.add(f"{field}: ARN service {parts[2]!r} is not secretsmanager or ssm")
    elif declared is not None and declared != arn_service:
        problems.add(f"{field}: objectType {kind!r} does not match the ARN's service {parts[2]!r}")
    if region and parts[3] != region:
        problems.add(
            f"{field}: the ARN's region {parts[3]!r} must match the region it is read in "
            f"({region!r})"
        )
    return declared or arn_service


def _check_versions(
    service: Service | None, version: str, label: str, where: str, problems: Problems
) -> None:
    if service != "ssm":
        return
    # Either is sent as the selector `name:<value>`, as upstream: not parsed here.
    if version and label:
        problems.add(
            f"{where}: an SSM parameter takes objectVersion or objectVersionLabel, not both"
        )


def _parse_failover(
    value: Any,
    where: str,
    service: Service | None,
    kind: str,
    store: AwsStore,
    problems: Problems,
) -> Target | None:
    if value is None or value == "" or value == {}:
        return None
    field = f"{where}.failoverObject"
    obj = expect_map(value, field, problems)
    if obj is None:
        return None
    obj = fold_keys(obj, FAILOVER_KEYS, field, problems)
    unknown_keys(obj, FAILOVER_KEYS, field, "failoverObject", problems, upstream=True)
    name = expect_str(obj.get("objectName"), f"{field}.objectName", problems, required=True)
    version = expect_str(obj.get("objectVersion"), f"{field}.objectVersion", problems)
    label = expect_str(obj.get("objectVersionLabel"), f"{field}.objectVersionLabel", problems)
    if not store.failover_region:
        problems.add(f"{field} needs the failoverRegion parameter (the region to read it in)")
    if not name:
        return None
    # An unknown objectType was reported for the object itself; do not repeat it here.
    known = kind if kind in _TYPES else ""
    if kind and not known:
        return Target(name, version, label)
    other = _service(name, known, store.failover_region, f"{field}.objectName", problems)
    if service is not None and other is not None and other != service:
        problems.add(f"{field}.objectName: a failover object must be of the same type")
    _check_versions(service, version, label, field, problems)
    return Target(name, version, label)


def _parse_jmes(
    item: Any,
    where: str,
    ref: AwsRef,
    translate: str | None,
    optional: bool,
    problems: Problems,
) -> ObjectSpec[Ref] | None:
    """A file extracted from the object's value: it reads the same secret, so it is optional
    when the object is (a missing secret leaves out every file made from it)."""
    entry = expect_map(item, where, problems)
    if entry is None:
        return None
    entry = fold_keys(entry, JMES_KEYS, where, problems)
    unknown_keys(entry, JMES_KEYS, where, "a jmesPath entry", problems, upstream=True)
    path = expect_str(entry.get("path"), f"{where}.path", problems, required=True)
    alias = expect_str(entry.get("objectAlias"), f"{where}.objectAlias", problems, required=True)
    mode = _parse_mode(entry.get("filePermission"), f"{where}.filePermission", problems)
    if path:
        check_jmespath(path, f"{where}.path", problems)
    if not (path and alias):
        return None
    transforms = Transforms(extract=path, parse_as="json", optional=optional)
    file_name = _file_name(alias, translate)
    field = _as_written(f"{where}.objectAlias", alias, file_name)
    return ObjectSpec(file_name, ref, mode, transforms, field)


def _parse_mode(value: Any, field: str, problems: Problems) -> int | None:
    """Upstream's filePermission: a string of four octal digits ("0400")."""
    if value is None or value == "":
        return None
    if isinstance(value, str) and _MODE.match(value):
        mode = int(value, 8)
        if mode > 0o777:
            problems.add(f"{field}: {value!r} sets special bits; use 0000..0777")
            return None
        return mode
    hint = ' (quote it in YAML: "0400")' if isinstance(value, int) else ""
    problems.add(f'{field}: expected four octal digits such as "0400", got {value!r}{hint}')
    return None


def _as_written(field: str, written: str, file_name: str) -> str:
    """The field for messages, with the value as the class wrote it when the file name is a
    rewrite of it (pathTranslation, a leading '/'): `objects[0].objectAlias '../../etc/passwd'`
    rather than only the file '.._.._etc_passwd' the user never wrote."""
    return field if written == file_name else f"{field} {written!r}"


def _file_name(name: str, translate: str | None) -> str:
    if translate is None:
        return name.lstrip("/")
    return name.replace("/", translate)
