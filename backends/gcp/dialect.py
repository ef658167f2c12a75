"""The gcp dialect: the GCP provider's SecretProviderClass parameters.

parameters:
  backend: gcp
  auth: pod-adc                # default; provider-adc = the node's identity (allow-listed)
  secrets: |
    - resourceName: projects/p/secrets/db/versions/latest
      path: db.json            # or the older fileName
      mode: 0400               # a YAML integer, as upstream
      extractJSONKey: password # or extractYAMLKey; a literal top-level key
    - resourceName: projects/p/locations/us-central1/secrets/api/versions/3
    - resourceName: projects/p/locations/global/parameters/app/versions/v1
      path: app.yaml           # Parameter Manager: the rendered payload (secret refs resolved)
  select: |                    # optional: every secret with a name prefix and labels
    - {project: p, namePrefix: app-, labels: {team: pay}, directory: app}

`secrets` may be left out when `select` is given (backends/gcp/selection.py).

The workload identity audience is not a parameter upstream either: it comes from the provider's
flags (`--gcp-project`, `--gcp-location`, `--gcp-cluster`, or `--gcp-workload-identity-audience`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from backends.gcp.names import ID, LOCATION, MAX_LOCATION
from backends.gcp.options import DEFAULT_GKE_PROVIDER, Options
from backends.gcp.selection import SELECT_KEYS as SELECT_KEYS
from backends.gcp.selection import GcpSelection
from backends.gcp.selection import selection as selection
from provider.core.changes import Subject
from provider.core.model import ObjectSpec, ParseContext, StorePlan, Transforms, hashed_once
from provider.core.parsing import (
    ObjectList,
    Problems,
    expect_str,
    parse_mode,
    parse_objects,
    parse_transforms,
    plain_secrets,
)

KEYS = frozenset({"secrets", "auth"})
OBJECT_KEYS = frozenset(
    {"resourceName", "path", "fileName", "mode", "extractJSONKey", "extractYAMLKey"}
)
OBJECTS = ObjectList(
    "a gcp secrets entry",
    OBJECT_KEYS,
    "secrets is required: a YAML list of {resourceName, path} entries, e.g. "
    "'- resourceName: projects/<project>/secrets/<secret>/versions/latest'",
    field="secrets",
    unique="path",
    empty="secrets: the list is empty; name at least one secret version",
)
AUTH_MODES = ("pod-adc", "provider-adc")

# Name segments are kept to what Google accepts (backends/gcp/names.py).
_ID, _LOCATION = ID, LOCATION
_GLOBAL = re.compile(
    rf"projects/(?P<project>{_ID})/secrets/(?P<secret>{_ID})/versions/(?P<v>{_ID})"
)
_REGIONAL = re.compile(
    rf"projects/(?P<project>{_ID})/locations/(?P<location>{_LOCATION})"
    rf"/secrets/(?P<secret>{_ID})/versions/(?P<v>{_ID})"
)
_PARAMETER = re.compile(
    rf"projects/(?P<project>{_ID})/locations/(?P<location>{_LOCATION})"
    rf"/parameters/(?P<parameter>{_ID})/versions/(?P<v>{_ID})"
)
_ANY_LOCATION = re.compile(r"projects/[^/]+/locations/(?P<location>[^/]*)/(secrets|parameters)/")
_FORMATS = (
    "projects/<project>/secrets/<secret>/versions/<version|latest>, "
    "projects/<project>/locations/<location>/secrets/<secret>/versions/<version|latest> or "
    "projects/<project>/locations/<location|global>/parameters/<parameter>/versions/<version>"
)

AuthMode = Literal["pod-adc", "provider-adc"]


@dataclass(frozen=True)
class Audience:
    """Where the pod's token goes: `token` is the audience the kubelet mints the pod token for,
    `sts` the audience of the STS exchange (they differ for GKE: pool vs. pool + cluster)."""

    token: str
    sts: str


@dataclass(frozen=True)
class GcpStore:
    auth: AuthMode
    #: Whether `auth` was written in the class (upstream refuses it with nodePublishSecretRef).
    auth_explicit: bool
    #: None under `check` or when the provider has no pool configured (then auth is refused).
    audience: Audience | None

    def describe(self) -> str:
        # Each ref names its project (and location): the class names no address of its own.
        return f"gcp ({self.auth})"


@hashed_once
@dataclass(frozen=True)
class GcpRef:
    """One secret version (AccessSecretVersion) or Parameter Manager parameter version
    (RenderParameterVersion); the same name in several entries is one call."""

    name: str
    #: The location of a regional secret or parameter (selects the regional endpoint), else None.
    location: str | None = None
    kind: Literal["secret", "parameter"] = "secret"

    def describe(self) -> str:
        return self.name if self.kind == "secret" else f"parameter {self.name}"


#: What a gcp object or selector reads.
Ref = GcpRef | GcpSelection


def parse(params: Mapping[str, str], ctx: ParseContext[Options]) -> StorePlan[GcpStore, Ref]:
    problems = Problems(strict=ctx.strict)
    auth = _parse_auth(params.get("auth", ""), problems)
    entry = functools.partial(_parse_entry, problems=problems)
    specs = parse_objects(params.get("secrets", ""), OBJECTS, entry, ctx, problems)
    audience = _audience(ctx, auth, problems)
    problems.raise_if_any()
    store = GcpStore(auth=auth, auth_explicit=bool(params.get("auth")), audience=audience)
    return StorePlan("gcp", store, tuple(specs), tuple(problems.warnings))


def _parse_auth(value: str, problems: Problems) -> AuthMode:
    text = value.strip()
    if text in ("", "pod-adc"):
        return "pod-adc"
    if text == "provider-adc":
        return "provider-adc"
    problems.add(f"auth: expected one of {', '.join(AUTH_MODES)} (default pod-adc), got {value!r}")
    return "pod-adc"


def _parse_entry(obj: Mapping[str, Any], where: str, problems: Problems) -> ObjectSpec[Ref] | None:
    name = expect_str(obj.get("resourceName"), f"{where}.resourceName", problems, required=True)
    ref = _parse_resource(name, f"{where}.resourceName", problems) if name else None
    path = expect_str(obj.get("path"), f"{where}.path", problems)
    file_name = expect_str(obj.get("fileName"), f"{where}.fileName", problems)
    if path and file_name and path != file_name:
        problems.add(f"{where}: path {path!r} and fileName {file_name!r} differ; give only path")
    field = f"{where}.path" if path else f"{where}.fileName"
    if not (path or file_name):
        problems.add(f"{where}.path is required: the file name to write the secret to")
    mode = parse_mode(obj.get("mode"), f"{where}.mode", problems)
    base = _extract_key(obj, where, problems)
    transforms = parse_transforms(obj, where, problems, base=base)
    if ref is None or not (path or file_name):
        return None
    # Upstream's ObjectVersion id is the resourceName as written (`…/versions/latest`).
    return ObjectSpec(path or file_name, ref, mode, transforms, field, version_id=name)


def _parse_resource(name: str, field: str, problems: Problems) -> GcpRef | None:
    name = name.strip()
    located = _ANY_LOCATION.match(name)
    if located and len(located["location"]) > MAX_LOCATION:
        # Upstream's check and words (util/location_extractor.go).
        problems.add(
            f"{field}: Invalid location: {located['location']}, location length exceeds limit "
            f"of {MAX_LOCATION} characters"
        )
        return None
    if _GLOBAL.fullmatch(name):
        return GcpRef(name)
    if match := _REGIONAL.fullmatch(name):
        return GcpRef(name, match["location"])
    if match := _PARAMETER.fullmatch(name):
        # locations/global is the global Parameter Manager endpoint, as upstream.
        location = None if match["location"] == "global" else match["location"]
        return GcpRef(name, location, "parameter")
    hint = ""
    if re.fullmatch(r"projects/[^/]+/parameters/.+", name):
        hint = (
            " (Parameter Manager versions are named with their location: "
            "projects/<project>/locations/global/parameters/<parameter>/versions/<version>)"
        )
    if re.fullmatch(r"projects/[^/]+/(locations/[^/]+/)?secrets/[^/]+", name):
        hint = f" (add '/versions/latest' for the newest version: {name}/versions/latest)"
    problems.add(f"{field}: {name!r} is not a secret version name; expected {_FORMATS}{hint}")
    return None


def _extract_key(obj: Mapping[str, Any], where: str, problems: Problems) -> Transforms:
    json_key = expect_str(obj.get("extractJSONKey"), f"{where}.extractJSONKey", problems)
    yaml_key = expect_str(obj.get("extractYAMLKey"), f"{where}.extractYAMLKey", problems)
    if json_key and yaml_key:
        problems.add(f"{where}: give at most one of extractJSONKey and extractYAMLKey")
        return Transforms()
    if json_key or yaml_key:
        if obj.get("extract"):
            spelled = "extractJSONKey" if json_key else "extractYAMLKey"
            problems.add(f"{where}: extract and {spelled} both select a part; give one of them")
        return Transforms(extract_key=json_key or yaml_key, parse_as="json" if json_key else "yaml")
    return Transforms()


def _audience(ctx: ParseContext[Options], auth: AuthMode, problems: Problems) -> Audience | None:
    """The workload identity audiences, from the provider's flags (never from parameters)."""
    if auth != "pod-adc":
        return None
    if ctx.offline:
        problems.warn(
            "the workload identity pool comes from the provider's --gcp-project, --gcp-location "
            "and --gcp-cluster (or --gcp-workload-identity-audience); not checked offline"
        )
        return None
    audience = workload_identity_audience(ctx.options)
    if audience is None:
        problems.add(
            "auth pod-adc needs the cluster's workload identity pool, which this provider was "
            "not given: start it with --gcp-project, --gcp-location and --gcp-cluster, or "
            "--gcp-workload-identity-audience"
        )
    return audience


def workload_identity_audience(options: Options | None) -> Audience | None:
    """Audiences as the GCP provider builds them: GKE pool + cluster, or an audience given whole.

    For `identitynamespace:<pool>:<provider>` (GKE and fleet workload identity) the pod's token
    is minted for the pool; any other audience (a workload identity federation provider) is
    used for both the pod's token and the exchange.
    """
    if options is None:
        return None
    whole = (options.workload_identity_audience or "").strip()
    if whole:
        parts = whole.split(":", 2)
        if len(parts) == 3 and parts[0] == "identitynamespace":
            return Audience(token=parts[1], sts=whole)
        return Audience(token=whole, sts=whole)
    project, location, cluster = options.project, options.location, options.cluster
    if not (project and location and cluster):
        return None
    pool = f"{project}.svc.id.goog"
    provider = f"{DEFAULT_GKE_PROVIDER}/projects/{project}/locations/{location}/clusters/{cluster}"
    return Audience(token=pool, sts=f"identitynamespace:{pool}:{provider}")


def audiences(store: GcpStore) -> tuple[str, ...]:
    """The audience of the pod token a mount of this class needs (`check --json`): the pool's
    (offline, where it comes from the provider's flags, a placeholder); none for provider-adc."""
    if store.auth != "pod-adc":
        return ()
    return (store.audience.token if store.audience else "<PROJECT>.svc.id.goog",)


# A secret or one of its versions, as Secret Manager's Pub/Sub notifications name them
# (`secretId`, `versionId`) and as classes write them.
_SECRET = re.compile(
    rf"projects/(?P<project>{_ID})/(?:locations/(?P<location>{_LOCATION})/)?"
    rf"secrets/(?P<secret>{_ID})(?:/versions/{_ID})?"
)


def secret_subject(resource: str) -> tuple[str, str] | None:
    """(project, name) of a secret or secret version resource name in the change feed
    (backends/gcp/changes.py names a notification's `secretId` by it, `subject` a ref): the
    name is the secret without its project and version, `secrets/<id>` or
    `locations/<l>/secrets/<id>`. Notifications name the project by number where classes
    usually write its id, so the project is the record's scope, used for coverage only; a
    secret of the same id in another project is over-matched, which costs a read. Every
    version shares its secret's name: adding one changes `latest`, disabling one a pinned ref."""
    match = _SECRET.fullmatch(resource)
    if match is None:
        return None
    location = f"locations/{match['location']}/" if match["location"] else ""
    return match["project"], f"{location}secrets/{match['secret']}"


def subject(store: GcpStore, ref: Ref) -> Subject | None:
    """What a ref answers to in the feed: its secret, every secret a selection's name prefix
    starts (labels only narrow it further). Parameter Manager sends no notifications, and a
    rendered parameter depends on the secrets it references, so parameters are in no feed."""
    if isinstance(ref, GcpSelection):
        location = f"locations/{ref.location}/" if ref.location else ""
        return Subject.of(ref.project, f"{location}secrets/{ref.prefix}", prefix=True)
    found = secret_subject(ref.name) if ref.kind == "secret" else None
    return Subject.of(*found) if found else None


#: Its answers are plain secrets: no lease, no certificate issued per read (`check`).
lifetime = plain_secrets


#: The object entries of a class of several stores, as this dialect's `secrets`.
listed = OBJECTS.listed
