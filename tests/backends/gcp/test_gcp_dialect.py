"""The gcp dialect parser: every upstream parameter, and every malformed input named."""

from __future__ import annotations

import pytest

from backends.gcp.dialect import Audience, GcpRef, GcpStore, parse, workload_identity_audience
from backends.gcp.options import Options
from provider.core.errors import InvalidParameters
from provider.core.model import ParseContext, Transforms

OPTIONS = Options(project="proj", location="europe-west1", cluster="c1")
ONLINE = ParseContext(options=OPTIONS)
GKE_AUDIENCE = Audience(
    token="proj.svc.id.goog",
    sts="identitynamespace:proj.svc.id.goog:https://container.googleapis.com/v1/projects/proj"
    "/locations/europe-west1/clusters/c1",
)

# The GCP provider's documented example (examples/app-secrets.yaml.tmpl and the extract-key
# example), parameters verbatim.
UPSTREAM_EXAMPLE = {
    "secrets": """
- resourceName: "projects/my-project/secrets/testsecret/versions/latest"
  path: "good1.txt"
- resourceName: "projects/my-project/secrets/testsecret/versions/latest"
  fileName: "good2.txt"
  mode: 0400
- resourceName: "projects/my-project/locations/us-central1/secrets/testsecret/versions/latest"
  path: "good3.txt"
  extractJSONKey: "user"
""",
}


def test_gcp_upstream_example_parses() -> None:
    plan = parse(UPSTREAM_EXAMPLE, ONLINE)
    assert plan.backend == "gcp"
    assert plan.store == GcpStore(auth="pod-adc", auth_explicit=False, audience=GKE_AUDIENCE)
    names = [o.name for o in plan.objects]
    assert names == ["good1.txt", "good2.txt", "good3.txt"]
    first, second, third = plan.objects
    # Two entries reading one version share one ref, so the core makes one call for both.
    assert (
        first.ref == second.ref == GcpRef("projects/my-project/secrets/testsecret/versions/latest")
    )
    assert hash(first.ref) == hash(second.ref)
    assert third.ref == GcpRef(
        "projects/my-project/locations/us-central1/secrets/testsecret/versions/latest",
        "us-central1",
    )
    assert (first.mode, second.mode, third.mode) == (None, 0o400, None)
    assert third.transforms == Transforms(extract_key="user", parse_as="json")
    assert (first.field, second.field) == ("secrets[0].path", "secrets[1].fileName")
    assert plan.warnings == ()


def test_gcp_extract_yaml_key_and_extensions() -> None:
    plan = parse(
        {
            "auth": "pod-adc",
            "secrets": """
- resourceName: projects/p/secrets/cfg/versions/3
  path: cfg
  extractYAMLKey: db-password
  decode: base64
- resourceName: projects/p/secrets/all/versions/latest
  path: all
  explode: true
  mode: 420
- resourceName: projects/p/secrets/j/versions/1
  path: j
  extract: '"db-password"'
  file: false
""",
        },
        ONLINE,
    )
    cfg, everything, j = plan.objects
    assert cfg.transforms == Transforms(extract_key="db-password", parse_as="yaml", decode="base64")
    assert everything.transforms == Transforms(explode=True)
    assert everything.mode == 0o644
    assert j.transforms == Transforms(extract='"db-password"', file=False)
    assert plan.store.auth_explicit is True  # type: ignore[attr-defined]


def test_gcp_provider_adc_needs_no_pool() -> None:
    plan = parse({"auth": "provider-adc", **UPSTREAM_EXAMPLE}, ParseContext(options=Options()))
    assert plan.store == GcpStore(auth="provider-adc", auth_explicit=True, audience=None)


def test_gcp_offline_check_warns_about_the_pool() -> None:
    plan = parse(UPSTREAM_EXAMPLE, ParseContext(options=None))
    assert plan.store.audience is None  # type: ignore[attr-defined]
    assert len(plan.warnings) == 1
    assert "--gcp-project" in plan.warnings[0]


def test_gcp_pool_missing_online_is_an_error() -> None:
    with pytest.raises(InvalidParameters) as err:
        parse(UPSTREAM_EXAMPLE, ParseContext(options=Options(project="proj")))
    assert "--gcp-cluster" in str(err.value)
    assert "--gcp-workload-identity-audience" in str(err.value)


@pytest.mark.parametrize(
    ("whole", "expected"),
    [
        (
            "identitynamespace:fleet.svc.id.goog:https://gkehub.googleapis.com/projects/p/x",
            Audience(
                "fleet.svc.id.goog",
                "identitynamespace:fleet.svc.id.goog:https://gkehub.googleapis.com/projects/p/x",
            ),
        ),
        (
            "//iam.googleapis.com/projects/123/locations/global/workloadIdentityPools/pool/"
            "providers/k8s",
            Audience(
                "//iam.googleapis.com/projects/123/locations/global/workloadIdentityPools/pool/"
                "providers/k8s",
                "//iam.googleapis.com/projects/123/locations/global/workloadIdentityPools/pool/"
                "providers/k8s",
            ),
        ),
    ],
)
def test_gcp_audience_given_whole(whole: str, expected: Audience) -> None:
    # Given whole, the audience wins over project/location/cluster.
    options = Options(project="other", location="l", cluster="c", workload_identity_audience=whole)
    assert workload_identity_audience(options) == expected
    assert parse(UPSTREAM_EXAMPLE, ParseContext(options=options)).store.audience == expected  # type: ignore[attr-defined]


def test_gcp_audience_built_from_cluster() -> None:
    assert workload_identity_audience(OPTIONS) == GKE_AUDIENCE
    assert workload_identity_audience(Options(project="p", location="l")) is None


GOOD = "projects/p/secrets/s/versions/1"

MALFORMED = [
    ({}, "secrets is required"),
    ({"secrets": "  "}, "secrets is required"),
    ({"secrets": "[]"}, "secrets: the list is empty"),
    ({"secrets": "resourceName: x"}, "secrets: expected a YAML list"),
    ({"secrets": "- [unclosed"}, "secrets: invalid YAML at line"),
    ({"secrets": "- just-a-string"}, "secrets[0]: expected a map"),
    ({"secrets": "- path: a"}, "secrets[0].resourceName is required"),
    ({"secrets": f"- resourceName: {GOOD}"}, "secrets[0].path is required"),
    ({"secrets": "- {resourceName: [a], path: a}"}, "secrets[0].resourceName: expected a string"),
    ({"secrets": "- {resourceName: projects/p/secrets/s, path: a}"}, "add '/versions/latest'"),
    ({"secrets": "- {resourceName: secrets/s/versions/1, path: a}"}, "is not a secret version"),
    (
        {"secrets": "- {resourceName: 'projects/p/secrets/s/versions/1/x', path: a}"},
        "secrets[0].resourceName: 'projects/p/secrets/s/versions/1/x' is not a secret version",
    ),
    (
        {"secrets": "- {resourceName: projects/p/parameters/x/versions/v, path: a}"},
        "Parameter Manager versions are named with their location",
    ),
    (
        # Upstream's location length limit (30), for secrets and parameters alike.
        {
            "secrets": f"- {{resourceName: projects/p/locations/{'a' * 31}/parameters/x/versions/v"
            ", path: a}"
        },
        "location length exceeds limit",
    ),
    (
        # The location becomes part of a host name: nothing but a region name may pass.
        {
            "secrets": "- {resourceName: 'projects/p/locations/evil.com:443/secrets/s/versions/1', "
            "path: a}"
        },
        "secrets[0].resourceName",
    ),
    (
        {"secrets": "- {resourceName: projects/p/locations/US/secrets/s/versions/1, path: a}"},
        "secrets[0].resourceName",
    ),
    ({"secrets": f"- {{resourceName: {GOOD}, path: a, mode: rw}}"}, "secrets[0].mode"),
    ({"secrets": f"- {{resourceName: {GOOD}, path: a, mode: 01777}}"}, "secrets[0].mode"),
    ({"secrets": f"- {{resourceName: {GOOD}, path: a, mode: true}}"}, "secrets[0].mode"),
    (
        {"secrets": f"- {{resourceName: {GOOD}, path: a, extractJSONKey: k, extractYAMLKey: k}}"},
        "secrets[0]: give at most one of extractJSONKey and extractYAMLKey",
    ),
    (
        {"secrets": f"- {{resourceName: {GOOD}, path: a, extractJSONKey: k, extract: k}}"},
        "secrets[0]: extract and extractJSONKey",
    ),
    (
        {"secrets": f"- {{resourceName: {GOOD}, path: a, extractJSONKey: {{x: 1}}}}"},
        "secrets[0].extractJSONKey: expected a string",
    ),
    (
        {"secrets": f"- {{resourceName: {GOOD}, path: a, fileName: b}}"},
        "secrets[0]: path 'a' and fileName 'b' differ",
    ),
    (
        {"secrets": f"- {{resourceName: {GOOD}, path: a, decode: rot13}}"},
        "secrets[0].decode",
    ),
    (
        {"secrets": f"- {{resourceName: {GOOD}, path: a, extract: 'a-b'}}"},
        "secrets[0].extract: invalid JMESPath",
    ),
    (
        {
            "secrets": f"- {{resourceName: {GOOD}, path: a}}\n"
            f"- {{resourceName: {GOOD}, fileName: a}}"
        },
        "path 'a' is used by secrets[0].path, secrets[1].fileName",
    ),
    ({"auth": "workload-identity", "secrets": f"- {{resourceName: {GOOD}, path: a}}"}, "auth:"),
]


@pytest.mark.parametrize(("parameters", "message"), MALFORMED)
def test_gcp_malformed_parameters(parameters: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidParameters) as err:
        parse(parameters, ONLINE)
    assert message in str(err.value)


def test_gcp_every_problem_reported_at_once() -> None:
    with pytest.raises(InvalidParameters) as err:
        parse(
            {
                "auth": "bogus",
                "secrets": "- {path: a, colour: red}\n- {resourceName: x, path: b, mode: 1000}",
            },
            ParseContext(options=OPTIONS, strict=True),
        )
    text = str(err.value)
    for fragment in (
        "auth:",
        "secrets[0].colour",
        "secrets[0].resourceName is required",
        "secrets[1].resourceName",
        "secrets[1].mode",
    ):
        assert fragment in text


def test_gcp_too_many_entries() -> None:
    lines = "".join(f"- {{resourceName: {GOOD}, path: f{i}}}\n" for i in range(4))
    with pytest.raises(InvalidParameters, match="over the limit of 3"):
        parse({"secrets": lines}, ParseContext(options=OPTIONS, max_objects=3))


def test_gcp_unknown_top_level_keys_are_left_to_the_core() -> None:
    plan = parse({**UPSTREAM_EXAMPLE, "somethingElse": "x"}, ONLINE)
    assert len(plan.objects) == 3


# Issue 32: no class parameter names a Google endpoint (they are the operator's --gcp-*-endpoint
# flags); a regional resource's location becomes a host name label of the regional endpoint,
# and the other name parts travel inside the gRPC request, never in a URL or host.
def test_gcp_no_parameter_is_an_endpoint() -> None:
    from backends.gcp.dialect import KEYS

    assert {"secrets", "auth"} == KEYS


@pytest.mark.parametrize(
    "location",
    [
        "us-central1?x=1",
        "us-central1#",
        "evil.example",
        "x@evil",
        "evil.example:443",
        "%2e%2e",
        "..",
        "us central1",
        "us-central1\\x",
        "us-c\uff45ntral1",
        "US-CENTRAL1",
    ],
)
@pytest.mark.parametrize("kind", ["secrets", "parameters"])
def test_gcp_location_cannot_carry_url_parts(location: str, kind: str) -> None:
    name = f"projects/p/locations/{location}/{kind}/s/versions/1"
    with pytest.raises(InvalidParameters) as info:
        parse({"secrets": f"- {{resourceName: '{name}', path: a}}"}, ONLINE)
    assert "secrets[0].resourceName" in str(info.value)


@pytest.mark.parametrize("part", ["s?x=1", "s#", "s@evil", "s%2f", "s b", "s\\x", "s/x"])
def test_gcp_name_parts_cannot_carry_url_parts(part: str) -> None:
    for name in (f"projects/{part}/secrets/s/versions/1", f"projects/p/secrets/{part}/versions/1"):
        with pytest.raises(InvalidParameters, match=r"secrets\[0\].resourceName"):
            parse({"secrets": f"- {{resourceName: '{name}', path: a}}"}, ONLINE)
