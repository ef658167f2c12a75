"""The Helm chart (deploy/helm/secrets-bridge), through helm-python-sdk (Helm v4's Go SDK):
lint, schema, rendered manifests (kubernetes-validate, checkov), the HMAC key's two paths, and
the chart against the kustomize base it must not drift from."""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
import re
import subprocess
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from backends import registry
from tests.deploy.conftest import DEPLOY, ROOT, Rendered, tool
from tests.deploy.helm_render import (
    ALL_ON,
    CHART,
    NAMESPACE,
    fake_kube_api,
    lint,
    load,
    notes,
    refusal,
    render,
    serve_parser,
)

CHECKOV = ROOT / ".tools" / "checkov" / "bin" / "checkov"
KEY_SECRET = "secrets-bridge-hmac"
#: As tests/deploy/test_deploy_checkov.py runs it: JSON lists skipped checks too; no network.
QUIET_JSON = ("--skip-download", "--output", "json")

#: The labels Helm charts conventionally add and kustomize does not; the equivalence test
#: ignores exactly these.
HELM_LABELS = {
    "helm.sh/chart",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
}


@pytest.fixture(scope="module")
def default() -> Rendered:
    return render()


@pytest.fixture(scope="module")
def all_on() -> Rendered:
    return render(ALL_ON)


def container(rendered: Rendered) -> dict[str, Any]:
    (c,) = rendered.one("DaemonSet")["spec"]["template"]["spec"]["containers"]
    found: dict[str, Any] = c
    return found


def merged(overrides: dict[str, Any], base: dict[str, Any] | None = None) -> dict[str, Any]:
    """A deep merge of overrides over base (for values tables)."""
    out = copy.deepcopy(base or {})
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(value, out[key])
        else:
            out[key] = value
    return out


# --- the chart itself -----------------------------------------------------------------------


def test_app_version_is_the_package_version() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    with load() as chart:
        assert chart.metadata["appVersion"] == project["version"] == "0.1.0"
        assert chart.metadata["apiVersion"] == "v2"
        assert chart.schema is not None


@pytest.mark.parametrize("values", [{}, ALL_ON], ids=["default", "all-on"])
def test_lint_strict_finds_no_error_and_no_warning(values: dict[str, Any]) -> None:
    report = lint(values)
    assert report["total_charts_linted"] == 1
    assert report["errors"] == []
    # 1 = info ("icon is recommended"); 2 = warning, 3 = error: strict lint fails on either.
    serious = [m for m in report["messages"] if m["severity"] >= 2]
    assert serious == [], serious


def test_lint_reports_bad_values_as_errors() -> None:
    # The same lint, so a clean report above is not a lint that checks nothing.
    report = lint({"cache": {"ttl": -5}})
    assert any(m["severity"] == 3 and "/cache/ttl" in m["error"] for m in report["messages"])


def _leaves(tree: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for key, value in tree.items():
        if isinstance(value, dict) and value and key not in _MAPS:
            out += _leaves(value, (*prefix, key))
        else:
            out.append((*prefix, key))
    return out


#: Values that are free-form maps (their keys are the operator's), typed as a whole.
_MAPS = {"resources", "nodeSelector", "affinity", "podAnnotations", "podLabels", "rateLimits"}


def _line_above(text: str) -> dict[tuple[str, ...], str]:
    """values.yaml: each key's path -> the line right above it."""
    above: dict[tuple[str, ...], str] = {}
    stack: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        match = re.match(r"^( *)([A-Za-z][\w.-]*):", line)
        if not match:
            continue
        depth = len(match[1]) // 2
        stack[depth:] = [match[2]]
        above[tuple(stack)] = lines[i - 1].strip() if i else ""
    return above


def test_every_value_is_typed_in_the_schema_and_documented() -> None:
    text = (CHART / "values.yaml").read_text()
    above = _line_above(text)
    with load() as chart:
        schema = chart.schema
    assert schema is not None and schema["additionalProperties"] is False
    leaves = _leaves(yaml.safe_load(text))
    assert len(leaves) > 60
    for leaf in leaves:
        name = ".".join(leaf)
        node = schema
        for key in leaf:
            node = node["properties"][key]
        assert "type" in node or "anyOf" in node, f"{name} has no type in the schema"
        assert node.get("description"), f"{name} has no description in the schema"
        assert above[leaf].startswith("#"), f"{name} in values.yaml has no comment above it"


# --- rendered manifests ---------------------------------------------------------------------


def test_default_render_holds_the_base_objects_and_no_optional_part(default: Rendered) -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in default.docs)
    assert kinds == [
        ("ClusterRole", "secrets-bridge"),
        ("ClusterRoleBinding", "secrets-bridge"),
        ("DaemonSet", "secrets-bridge"),
        # On by default, as in the base: the health port is closed to tenant pods (issue 32).
        ("NetworkPolicy", "secrets-bridge"),
        ("ResourceQuota", "secrets-bridge-node-critical-pods"),
        ("Secret", KEY_SECRET),
        ("ServiceAccount", "secrets-bridge"),
    ]
    namespaced = [d for d in default.docs if not d["kind"].startswith("Cluster")]
    assert {d["metadata"]["namespace"] for d in namespaced} == {NAMESPACE}


def test_all_on_render_adds_every_optional_part(all_on: Rendered) -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in all_on.docs)
    assert kinds == [
        ("ClusterRole", "secrets-bridge"),
        ("ClusterRole", "secrets-bridge-token-request"),
        ("ClusterRoleBinding", "secrets-bridge"),
        ("ClusterRoleBinding", "secrets-bridge-token-request"),
        ("ConfigMap", "secrets-bridge-dashboard"),
        ("DaemonSet", "secrets-bridge"),
        ("NetworkPolicy", "secrets-bridge"),
        ("ResourceQuota", "secrets-bridge-node-critical-pods"),
        ("Secret", KEY_SECRET),
        ("Service", "secrets-bridge-metrics"),
        ("ServiceAccount", "secrets-bridge"),
        ("ServiceMonitor", "secrets-bridge"),
    ]


@pytest.mark.parametrize("which", ["default", "all_on"])
def test_rendered_built_in_kinds_are_valid_against_the_kubernetes_schema(
    which: str, request: pytest.FixtureRequest
) -> None:
    rendered: Rendered = request.getfixturevalue(which)
    version = kubernetes_validate.latest_version()
    errors, validated = [], []
    for doc in rendered.docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD kubernetes-validate has no schema for; checked structurally below
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(
                f"{doc['kind']}/{doc['metadata']['name']} at {list(exc.path)}: {exc.message}"
            )
        validated.append(doc["kind"])
    assert not errors, "\n".join(errors)
    assert "DaemonSet" in validated and "Secret" in validated


def test_service_monitor_scrapes_the_provider_pods_metrics(all_on: Rendered) -> None:
    monitor = all_on.one("ServiceMonitor")
    service = all_on.one("Service")
    pod_labels = all_on.one("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert port["port"] == 8098 and port["targetPort"] == "health"


def test_dashboard_configmap_carries_the_sidecar_label_and_the_same_dashboard(
    all_on: Rendered,
) -> None:
    copy_in_chart = CHART / "dashboards" / "secrets-bridge.json"
    # Helm reads files only inside the chart: the chart holds a copy, kept byte-identical.
    assert not copy_in_chart.is_symlink()
    assert copy_in_chart.read_bytes() == (DEPLOY / "grafana-dashboard.json").read_bytes(), (
        "deploy/helm/secrets-bridge/dashboards/secrets-bridge.json differs from "
        "deploy/grafana-dashboard.json: copy it again"
    )
    configmap = all_on.one("ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "secrets"}
    (data,) = configmap["data"].values()
    assert json.loads(data) == json.loads((DEPLOY / "grafana-dashboard.json").read_text())


def _checkov(directory: Path) -> Any:
    checkov = tool(str(CHECKOV), "checkov", "run `make tools` (deploy/tools.sh)")
    result = subprocess.run(
        [checkov, "-d", str(directory), "--framework", "kubernetes", "--compact", *QUIET_JSON],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=directory,
    )
    assert result.stdout.strip(), f"checkov printed nothing:\n{result.stderr[-3000:]}"
    out = json.loads(result.stdout)
    (report,) = [r for r in (out if isinstance(out, list) else [out]) if r]
    assert report["check_type"] == "kubernetes"
    return report


@pytest.fixture(scope="module")
def checkov_report(
    default: Rendered, all_on: Rendered, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    scan = tmp_path_factory.mktemp("checkov-helm")
    (scan / "default.yaml").write_text(default.text)
    (scan / "all-on.yaml").write_text(all_on.text)
    return _checkov(scan)


def _skip_ids(daemonset: dict[str, Any]) -> dict[str, str]:
    """check id -> reason, from the checkov.io/skip<N> annotations."""
    return dict(
        value.split("=", 1)
        for key, value in daemonset["metadata"]["annotations"].items()
        if key.startswith("checkov.io/skip")
    )


def test_checkov_finds_no_failed_check_in_the_chart(checkov_report: Any) -> None:
    failed = checkov_report["results"]["failed_checks"]
    assert not failed, "\n".join(
        f"{c['check_id']} {c['check_name']} ({Path(c['file_path']).name}: {c['resource']})"
        for c in failed
    )
    assert checkov_report["summary"]["parsing_errors"] == 0
    assert checkov_report["summary"]["passed"] > 100, "checkov checked next to nothing"


def test_checkov_skips_exactly_the_bases_decided_checks_with_reasons(
    checkov_report: Any, base: Rendered
) -> None:
    decided = set(_skip_ids(base.one("DaemonSet")))
    skipped = checkov_report["results"]["skipped_checks"]
    by_file: dict[str, set[str]] = {}
    for check in skipped:
        by_file.setdefault(Path(check["file_path"]).name, set()).add(check["check_id"])
        assert len(check["check_result"].get("suppress_comment", "")) > 20, check["check_id"]
    assert by_file["default.yaml"] == decided
    # Pinned by digest, the all-on render needs no CKV_K8S_43 skip: the check passes.
    assert by_file["all-on.yaml"] == decided - {"CKV_K8S_43"}
    passed = {
        (Path(c["file_path"]).name, c["check_id"])
        for c in checkov_report["results"]["passed_checks"]
    }
    assert ("all-on.yaml", "CKV_K8S_43") in passed


# --- values become flags the provider accepts -----------------------------------------------

#: (values, argparse dest, the value serve parses) for every flag a chart value sets.
EVERY_VALUE: list[tuple[dict[str, Any], str, Any]] = [
    ({"logLevel": "debug"}, "log_level", "debug"),
    ({"logFormat": "text"}, "log_format", "text"),
    ({"gracePeriodSeconds": 20, "terminationGracePeriodSeconds": 40}, "grace_period", 20.0),
    ({"logRepeatsEverySeconds": 0}, "log_repeats_every", 0.0),
    ({"eventLoop": "asyncio"}, "event_loop", "asyncio"),
    ({"healthPort": 9100}, "health_addr", "0.0.0.0:9100"),
    ({"providersDir": "/run/providers"}, "socket", "/run/providers/secrets-bridge.sock"),
    ({"cache": {"ttl": 12.5}}, "cache_ttl", 12.5),
    ({"cache": {"minRefreshInterval": 10}}, "min_refresh_interval", 10.0),
    ({"cache": {"maxRefreshInterval": 600}}, "max_refresh_interval", 600.0),
    ({"cache": {"revalidateMaxAge": 60}}, "aws__revalidate_max_age", 60.0),
    ({"cache": {"serveStaleMaxAge": 300}}, "serve_stale_max_age", 300.0),
    ({"cache": {"serveStaleWait": 0}}, "serve_stale_wait", 0.0),
    ({"cache": {"storeCallTimeout": 2.5}}, "store_call_timeout", 2.5),
    ({"cache": {"scope": "pod"}}, "cache_scope", "pod"),
    ({"changeFeed": {"enabled": True}}, "change_feed", True),
    # The window and staleness pass with --change-feed: two flags (FEED_FLAGS).
    ({"changeFeed": {"enabled": True, "window": 7200}}, "feed_window", 7200.0),
    ({"changeFeed": {"enabled": True, "staleAfter": 120}}, "feed_stale_after", 120.0),
    ({"cache": {"maxConcurrentFetches": 16}}, "max_concurrent_fetches", 16),
    (
        {"cache": {"maxConcurrentFetchesPerNamespace": 4}},
        "max_concurrent_fetches_per_namespace",
        4,
    ),
    ({"rateLimits": {"azure": 400, "aws": 40.5}}, "rate_limit", "aws=40.5,azure=400"),
    ({"limits": {"maxObjects": 250}}, "max_objects", 250),
    ({"limits": {"maxReadBytes": 33554432}}, "max_read_bytes", 33554432),
    ({"limits": {"maxReadBytesPerNamespace": 8388608}}, "max_read_bytes_per_namespace", 8388608),
    ({"limits": {"maxResponseBytes": 8388608}}, "max_response_bytes", 8388608),
    ({"allowNodeIdentityNamespaces": ["a", "b"]}, "allow_node_identity_namespaces", "a,b"),
    ({"tokenRequestFallback": {"enabled": True}}, "token_request_fallback", True),
    ({"strictParameters": True}, "strict_parameters", True),
    ({"auditLog": "-"}, "audit_log", "-"),
    ({"vault": {"address": "https://vault:8200"}}, "vault__addr", "https://vault:8200"),
    ({"vault": {"namespace": "team-a"}}, "vault__namespace", "team-a"),
    ({"vault": {"caCert": "/etc/ca/ca.crt"}}, "vault__ca_cert", "/etc/ca/ca.crt"),
    ({"vault": {"caDir": "/etc/ca"}}, "vault__ca_dir", "/etc/ca"),
    ({"vault": {"tlsServerName": "vault.internal"}}, "vault__tls_server_name", "vault.internal"),
    ({"vault": {"clientCert": "/etc/tls/tls.crt"}}, "vault__client_cert", "/etc/tls/tls.crt"),
    ({"vault": {"clientKey": "/etc/tls/tls.key"}}, "vault__client_key", "/etc/tls/tls.key"),
    ({"vault": {"maxConnections": 8}}, "vault__max_connections", 8),
    ({"vault": {"requestTimeout": 5}}, "vault__request_timeout", 5.0),
    ({"vault": {"tokenRenewMargin": 0.5}}, "vault__token_renew_margin", 0.5),
    ({"aws": {"region": "eu-west-1"}}, "aws__region", "eu-west-1"),
    (
        {"aws": {"endpoints": "us-east-1=http://moto:5000"}},
        "aws__endpoints",
        "us-east-1=http://moto:5000",
    ),
    ({"aws": {"stsEndpoint": "https://sts.example"}}, "aws__sts_endpoint", "https://sts.example"),
    (
        {"aws": {"podIdentityEndpoint": "http://169.254.170.23/x"}},
        "aws__pod_identity_endpoint",
        "http://169.254.170.23/x",
    ),
    ({"aws": {"maxConcurrency": 4}}, "aws__max_concurrency", 4),
    ({"aws": {"connectTimeout": 1.5}}, "aws__connect_timeout", 1.5),
    ({"aws": {"readTimeout": 20}}, "aws__read_timeout", 20.0),
    ({"gcp": {"project": "my-project"}}, "gcp__project", "my-project"),
    ({"gcp": {"location": "europe-west1"}}, "gcp__location", "europe-west1"),
    ({"gcp": {"cluster": "prod"}}, "gcp__cluster", "prod"),
    (
        {"gcp": {"workloadIdentityAudience": "identitynamespace:p.svc.id.goog:https://x"}},
        "gcp__workload_identity_audience",
        "identitynamespace:p.svc.id.goog:https://x",
    ),
    ({"gcp": {"stsEndpoint": "https://sts.example"}}, "gcp__sts_endpoint", "https://sts.example"),
    ({"gcp": {"iamEndpoint": "https://iam.example"}}, "gcp__iam_endpoint", "https://iam.example"),
    ({"gcp": {"secretmanagerEndpoint": "sm:443"}}, "gcp__secretmanager_endpoint", "sm:443"),
    (
        {"gcp": {"regionalEndpoint": "sm.{location}:443"}},
        "gcp__regional_endpoint",
        "sm.{location}:443",
    ),
    (
        {"gcp": {"parametermanagerEndpoint": "pm:443"}},
        "gcp__parametermanager_endpoint",
        "pm:443",
    ),
    (
        {"gcp": {"parametermanagerRegionalEndpoint": "pm.{location}:443"}},
        "gcp__parametermanager_regional_endpoint",
        "pm.{location}:443",
    ),
    (
        {"gcp": {"tokenUris": ["https://oauth2.example/token", "http://sts.test:8080/token"]}},
        "gcp__token_uris",
        "https://oauth2.example/token,http://sts.test:8080/token",
    ),
    ({"gcp": {"caFile": "/etc/ca/g.pem"}}, "gcp__ca_file", "/etc/ca/g.pem"),
    (
        {"azure": {"authorityHost": "https://login.example"}},
        "azure__authority_host",
        "https://login.example",
    ),
    ({"azure": {"vaultDnsSuffix": "vault.example"}}, "azure__vault_dns_suffix", "vault.example"),
    ({"azure": {"caFile": "/etc/ca/a.pem"}}, "azure__ca_file", "/etc/ca/a.pem"),
    ({"azure": {"connectTo": "proxy:8443"}}, "azure__connect_to", "proxy:8443"),
    (
        {"azure": {"tokenProxyUrl": "https://k8s.example:443"}},
        "azure__token_proxy_url",
        "https://k8s.example:443",
    ),
    ({"azure": {"sniName": "a1b2.ests.aks"}}, "azure__sni_name", "a1b2.ests.aks"),
    (
        {"azure": {"tokenProxyCaFile": "/etc/ca/k.pem"}},
        "azure__token_proxy_ca_file",
        "/etc/ca/k.pem",
    ),
    ({"extraArgs": ["--kube-api-url=https://k8s:6443"]}, "kube_api_url", "https://k8s:6443"),
    ({"lifetimes": {"renewAt": "1/2"}}, "renew_at", 0.5),
    ({"lifetimes": {"leaseIdleAfter": 300}}, "lease_idle_after", 300.0),
    ({"lifetimes": {"maxHeldCredentials": 500}}, "max_held_credentials", 500),
    ({"lifetimes": {"minRenewInterval": 60}}, "min_renew_interval", 60.0),
    ({"lifetimes": {"replacedCredentialGrace": 120}}, "replaced_credential_grace", 120.0),
]

#: serve flags on purpose without a value of their own: tests only, or fixed by the chart.
NOT_A_VALUE = {
    "hmac_key_file",  # the mounted key, always
    "enable_fake_backend",  # tests and demos
    "kube_api_url",  # in-cluster config; extraArgs for anything else
    "kube_api_token_file",  # with --kube-api-url only
    "vault__skip_verify",  # tests only (the flag's own help says so)
    "gcp__local_channel",  # tests only
    "fake__store_file",  # the fake backend: tests and demos
    "fake__latency",
    "feed_namespace",  # the feed's ConfigMaps are in the release's namespace (POD_NAMESPACE)
}
#: Values that pass their flag with --change-feed, which they need.
FEED_FLAGS = {"feed_window", "feed_stale_after"}


def _serve_dests() -> set[str]:
    return {a.dest for a in serve_parser()._actions if a.dest != "help"}


def _store_dests(name: str) -> set[str]:
    """The argparse dests of a store's flags (`--<name>-<field>`, from its Options)."""
    return {f"{name}__{f.name}" for f in dataclasses.fields(registry.options_class(name))}


def _charted_stores() -> list[str]:
    """The stores with a section of their own in values.yaml: each of their flags is a value.
    A store without one takes its flags through extraArgs or extraEnv (no chart edit)."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    return [name for name in registry.names() if isinstance(values.get(name), dict)]


def test_every_serve_flag_has_a_chart_value_or_a_reason_not_to() -> None:
    covered = {dest for _, dest, _ in EVERY_VALUE}
    charted = _charted_stores()
    assert {"vault", "aws", "gcp", "azure"} <= set(charted)  # the scan finds the sections
    through_extra_args = {d for n in registry.names() if n not in charted for d in _store_dests(n)}
    missing = _serve_dests() - covered - NOT_A_VALUE - through_extra_args
    assert not missing, f"serve flags with no chart value: {sorted(missing)}"
    for name in charted:
        for dest in _store_dests(name):
            flag = "--" + dest.replace("__", "-").replace("_", "-")
            assert dest in covered | NOT_A_VALUE, f"{flag} has no chart value"


@pytest.mark.parametrize(
    ("values", "dest", "expected"), EVERY_VALUE, ids=[d for _, d, _ in EVERY_VALUE]
)
def test_each_value_becomes_one_flag_serve_parses(
    values: dict[str, Any], dest: str, expected: Any
) -> None:
    args = container(render(values))["args"]
    assert args[0] == "serve"
    parsed = serve_parser().parse_args(args[1:])
    assert getattr(parsed, dest) == expected, args
    assert all(a.startswith("--") for a in args[1:]), args
    extra = 2 if dest in FEED_FLAGS else 1
    assert len(args) <= len(container(render())["args"]) + extra, "one flag per value"


def test_default_values_pass_no_flag_beyond_the_bases(default: Rendered, base: Rendered) -> None:
    assert container(default)["args"] == container(base)["args"]


def test_extra_args_and_env_are_passed_as_given() -> None:
    values = {
        "extraArgs": ["--max-objects=7"],
        "extraEnv": [{"name": "SECRETS_BRIDGE_CACHE_TTL", "value": "5"}],
    }
    c = container(render(values))
    assert c["args"][-1] == "--max-objects=7"
    assert c["env"] == [{"name": "SECRETS_BRIDGE_CACHE_TTL", "value": "5"}]


def test_image_reference_takes_tag_and_digest() -> None:
    digest = "sha256:" + "ab" * 32
    values = {"image": {"repository": "registry.example/sb", "tag": "0.2.0", "digest": digest}}
    assert container(render(values))["image"] == f"registry.example/sb:0.2.0@{digest}"
    assert container(render())["image"] == "ghcr.io/secrets-bridge/secrets-bridge:0.1.0"


# --- the schema refuses bad values ----------------------------------------------------------

#: (values, what the message must contain): one refusal each.
REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("negative cache ttl", {"cache": {"ttl": -1}}, "/cache/ttl"),
    ("cache ttl as a string", {"cache": {"ttl": "30s"}}, "/cache/ttl"),
    ("negative revalidate age", {"cache": {"revalidateMaxAge": -1}}, "/cache/revalidateMaxAge"),
    ("negative stale age", {"cache": {"serveStaleMaxAge": -5}}, "/cache/serveStaleMaxAge"),
    ("relative audit path", {"auditLog": "audit.log"}, "/auditLog"),
    ("unknown cache scope", {"cache": {"scope": "namespace"}}, "/cache/scope"),
    (
        "fractional fetch limit",
        {"cache": {"maxConcurrentFetches": 2.5}},
        "/cache/maxConcurrentFetches",
    ),
    ("zero fetch limit", {"cache": {"maxConcurrentFetches": 0}}, "/cache/maxConcurrentFetches"),
    (
        "zero per-namespace fetch limit",
        {"cache": {"maxConcurrentFetchesPerNamespace": 0}},
        "/cache/maxConcurrentFetchesPerNamespace",
    ),
    (
        "fractional per-namespace fetch limit",
        {"cache": {"maxConcurrentFetchesPerNamespace": 1.5}},
        "/cache/maxConcurrentFetchesPerNamespace",
    ),
    ("zero store call timeout", {"cache": {"storeCallTimeout": 0}}, "/cache/storeCallTimeout"),
    (
        "negative store call timeout",
        {"cache": {"storeCallTimeout": -10}},
        "/cache/storeCallTimeout",
    ),
    (
        "store call timeout as a string",
        {"cache": {"storeCallTimeout": "10s"}},
        "/cache/storeCallTimeout",
    ),
    ("negative stale wait", {"cache": {"serveStaleWait": -1}}, "/cache/serveStaleWait"),
    ("stale wait as a string", {"cache": {"serveStaleWait": "3s"}}, "/cache/serveStaleWait"),
    ("unknown log level", {"logLevel": "verbose"}, "/logLevel"),
    ("unknown log format", {"logFormat": "yaml"}, "/logFormat"),
    ("numeric image tag", {"image": {"tag": 1.0}}, "/image/tag"),
    ("malformed digest", {"image": {"digest": "sha256:abc"}}, "/image/digest"),
    ("unknown pull policy", {"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ("port out of range", {"healthPort": 70000}, "/healthPort"),
    ("port as a string", {"healthPort": "8098"}, "/healthPort"),
    ("relative providers dir", {"providersDir": "run/providers"}, "/providersDir"),
    # Store names, not a list of stores: the provider refuses a name it has no store for.
    ("rate limit for a name no store has", {"rateLimits": {"Vault": 10}}, "'Vault'"),
    ("zero rate limit", {"rateLimits": {"aws": 0}}, "/rateLimits/aws"),
    (
        "fallback flag as a string",
        {"tokenRequestFallback": {"enabled": "yes"}},
        "/tokenRequestFallback/enabled",
    ),
    ("strict parameters as a string", {"strictParameters": "true"}, "/strictParameters"),
    (
        "namespaces as one string",
        {"allowNodeIdentityNamespaces": "a,b"},
        "/allowNodeIdentityNamespaces",
    ),
    (
        "invalid namespace name",
        {"allowNodeIdentityNamespaces": ["Team_A"]},
        "/allowNodeIdentityNamespaces/0",
    ),
    ("extra arg without dashes", {"extraArgs": ["cache-ttl=5"]}, "/extraArgs/0"),
    ("env entry without a name", {"extraEnv": [{"value": "x"}]}, "/extraEnv/0"),
    ("vault address without a scheme", {"vault": {"address": "vault:8200"}}, "/vault/address"),
    ("negative vault timeout", {"vault": {"requestTimeout": -1}}, "/vault/requestTimeout"),
    ("vault renew margin above 1", {"vault": {"tokenRenewMargin": 1.5}}, "/vault/tokenRenewMargin"),
    ("aws region in capitals", {"aws": {"region": "EU-WEST-1"}}, "/aws/region"),
    ("aws endpoints without urls", {"aws": {"endpoints": "us-east-1=moto"}}, "/aws/endpoints"),
    ("zero aws timeout", {"aws": {"readTimeout": 0}}, "/aws/readTimeout"),
    (
        "gcp endpoint without a port",
        {"gcp": {"secretmanagerEndpoint": "sm.example"}},
        "/gcp/secretmanagerEndpoint",
    ),
    (
        "gcp parameter manager endpoint as a url",
        {"gcp": {"parametermanagerEndpoint": "https://pm.example"}},
        "/gcp/parametermanagerEndpoint",
    ),
    (
        "gcp regional parameter manager endpoint without a port",
        {"gcp": {"parametermanagerRegionalEndpoint": "pm.{location}.example"}},
        "/gcp/parametermanagerRegionalEndpoint",
    ),
    (
        "gcp token uris as one string",
        {"gcp": {"tokenUris": "https://a.example/token,https://b.example/token"}},
        "/gcp/tokenUris",
    ),
    (
        "gcp token uri without a scheme",
        {"gcp": {"tokenUris": ["oauth2.example/token"]}},
        "/gcp/tokenUris/0",
    ),
    (
        "gcp token uri holding a comma",
        {"gcp": {"tokenUris": ["https://a.example/token,https://b.example/token"]}},
        "/gcp/tokenUris/0",
    ),
    ("backend in notes that is no store name", {"backends": ["Vault"]}, "/backends/0"),
    ("a key in the values file", {"hmacKey": {"key": "c2VjcmV0"}}, "'key' not allowed"),
    (
        "existing secret with a bad name",
        {"hmacKey": {"existingSecret": "My Key"}},
        "/hmacKey/existingSecret",
    ),
    ("unknown top-level value", {"cacheTtl": 30}, "'cacheTtl' not allowed"),
    ("misspelt nested value", {"vault": {"adress": "https://v"}}, "'adress' not allowed"),
    (
        "unparseable cpu request",
        {"resources": {"requests": {"cpu": "lots"}}},
        "/resources/requests/cpu",
    ),
    ("unknown resource name", {"resources": {"limits": {"gpu": 1}}}, "gpu"),
    ("node selector value not a string", {"nodeSelector": {"disk": True}}, "/nodeSelector/disk"),
    ("switch as a string", {"networkPolicy": {"enabled": "true"}}, "/networkPolicy/enabled"),
    (
        "scrape interval in words",
        {"serviceMonitor": {"interval": "30 seconds"}},
        "/serviceMonitor/interval",
    ),
    ("zero pods in the quota", {"resourceQuota": {"pods": 0}}, "/resourceQuota/pods"),
    ("maxUnavailable zero", {"maxUnavailable": 0}, "/maxUnavailable"),
    (
        "termination grace not above the drain grace",
        {"gracePeriodSeconds": 30, "terminationGracePeriodSeconds": 30},
        "terminationGracePeriodSeconds (30) must be above gracePeriodSeconds (30)",
    ),
]


@pytest.mark.parametrize(
    ("values", "message"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_bad_values_are_refused_with_a_message_naming_them(
    values: dict[str, Any], message: str
) -> None:
    assert message in refusal(values)


# --- the HMAC key ---------------------------------------------------------------------------


def test_existing_key_secret_renders_no_secret_and_is_mounted() -> None:
    rendered = render({"hmacKey": {"existingSecret": "my-hmac"}})
    assert not rendered.all("Secret")
    volumes = rendered.one("DaemonSet")["spec"]["template"]["spec"]["volumes"]
    (volume,) = [v for v in volumes if v["name"] == "hmac-key"]
    assert volume["secret"] == {"secretName": "my-hmac", "defaultMode": 0o400}
    mounts = container(rendered)["volumeMounts"]
    assert {"name": "hmac-key", "mountPath": "/etc/secrets-bridge/hmac", "readOnly": True} in mounts
    assert "--hmac-key-file=/etc/secrets-bridge/hmac/key" in container(rendered)["args"]


def test_existing_key_secret_under_another_data_key_is_mapped_to_the_key_file() -> None:
    rendered = render({"hmacKey": {"existingSecret": "my-hmac", "existingSecretKey": "hmac.key"}})
    volumes = rendered.one("DaemonSet")["spec"]["template"]["spec"]["volumes"]
    (volume,) = [v for v in volumes if v["name"] == "hmac-key"]
    assert volume["secret"]["items"] == [{"key": "hmac.key", "path": "key"}]


def test_generated_key_secret_is_kept_by_helm_and_mounted(default: Rendered) -> None:
    secret = default.one("Secret")
    assert secret["metadata"]["name"] == KEY_SECRET
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert secret["type"] == "Opaque"
    key = base64.b64decode(secret["data"]["key"]).decode()
    assert re.fullmatch(r"[A-Za-z0-9]{64}", key), "a 64-character random key"
    volumes = default.one("DaemonSet")["spec"]["template"]["spec"]["volumes"]
    assert {
        "name": "hmac-key",
        "secret": {"secretName": KEY_SECRET, "defaultMode": 0o400},
    } in volumes


def test_key_template_reads_the_existing_secret_with_lookup() -> None:
    source = (CHART / "templates" / "hmac-secret.yaml").read_text()
    assert 'lookup "v1" "Secret" .Release.Namespace $name' in source
    assert "randAlphaNum" in source


def test_offline_render_finds_no_secret_and_generates_a_fresh_key() -> None:
    # `helm template` has no cluster: lookup is empty, so each render shows a new key.
    first, second = (render().one("Secret")["data"]["key"] for _ in range(2))
    assert first != second


def test_upgrade_keeps_the_key_lookup_reads_from_the_cluster() -> None:
    existing = base64.b64encode(b"the-key-of-the-first-install").decode()
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": KEY_SECRET, "namespace": NAMESPACE},
        "type": "Opaque",
        "data": {"key": existing},
    }
    with fake_kube_api({(NAMESPACE, KEY_SECRET): secret}) as api:
        rendered = api.render(upgrade=True)
    assert rendered.one("Secret")["data"]["key"] == existing
    assert f"/api/v1/namespaces/{NAMESPACE}/secrets/{KEY_SECRET}" in [
        r.split("?")[0] for r in api.requests
    ]


def test_first_install_generates_a_key_when_lookup_finds_none() -> None:
    with fake_kube_api({}) as api:
        first = api.render(upgrade=False).one("Secret")["data"]["key"]
        second = api.render(upgrade=False).one("Secret")["data"]["key"]
    assert f"/api/v1/namespaces/{NAMESPACE}/secrets/{KEY_SECRET}" in [
        r.split("?")[0] for r in api.requests
    ]
    assert re.fullmatch(r"[A-Za-z0-9]{64}", base64.b64decode(first).decode())
    assert first != second


# --- one source of truth: the chart against the kustomize base ------------------------------


def _without_helm_labels(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: (
                {lk: lv for lk, lv in v.items() if lk not in HELM_LABELS}
                if k in ("labels", "matchLabels") and isinstance(v, dict)
                else _without_helm_labels(v)
            )
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_without_helm_labels(v) for v in node]
    return node


def _base_daemonset_spec(rendered: Rendered) -> dict[str, Any]:
    """The base's DaemonSet spec with the key Secret's name as kustomize's generator writes it
    minus its content-hash suffix (secrets-bridge-hmac-<hash> -> secrets-bridge-hmac)."""
    spec: dict[str, Any] = copy.deepcopy(rendered.one("DaemonSet")["spec"])
    for volume in spec["template"]["spec"]["volumes"]:
        if "secret" in volume:
            name = volume["secret"]["secretName"]
            assert re.fullmatch(rf"{KEY_SECRET}-[a-z0-9]{{10}}", name), name
            volume["secret"]["secretName"] = KEY_SECRET
    return spec


def _bodies(rendered: Rendered, *kinds: str) -> list[dict[str, Any]]:
    """The objects of these kinds with metadata cut to name and namespace, Helm labels gone."""
    out = []
    for doc in rendered.docs:
        if doc["kind"] in kinds:
            body = _without_helm_labels({k: v for k, v in doc.items() if k != "metadata"})
            body["metadata"] = {
                k: doc["metadata"][k] for k in ("name", "namespace") if k in doc["metadata"]
            }
            out.append(body)
    return sorted(out, key=lambda d: (d["kind"], d["metadata"]["name"]))


RBAC = ("ClusterRole", "ClusterRoleBinding", "ServiceAccount")


def test_chart_daemonset_spec_is_the_bases(default: Rendered, base: Rendered) -> None:
    assert _without_helm_labels(default.one("DaemonSet")["spec"]) == _base_daemonset_spec(base)


def test_chart_rbac_serviceaccount_and_quota_are_the_bases(
    default: Rendered, base: Rendered
) -> None:
    kinds = (*RBAC, "ResourceQuota")
    assert _bodies(default, *kinds) == _bodies(base, *kinds)


def test_chart_network_policy_is_the_bases(default: Rendered, base: Rendered) -> None:
    assert _bodies(default, "NetworkPolicy") == _bodies(base, "NetworkPolicy")


def test_chart_token_request_fallback_is_the_overlay(overlay: Rendered) -> None:
    chart = render({"tokenRequestFallback": {"enabled": True}})
    assert _without_helm_labels(chart.one("DaemonSet")["spec"]) == _base_daemonset_spec(overlay)
    assert _bodies(chart, *RBAC) == _bodies(overlay, *RBAC)


def test_chart_key_secret_is_shaped_like_the_bases(default: Rendered, base: Rendered) -> None:
    ours, theirs = default.one("Secret"), base.one("Secret")
    assert ours["type"] == theirs["type"] and set(ours["data"]) == set(theirs["data"]) == {"key"}


def test_chart_skips_the_same_checks_with_the_same_reasons(
    default: Rendered, base: Rendered
) -> None:
    ours, theirs = _skip_ids(default.one("DaemonSet")), _skip_ids(base.one("DaemonSet"))
    assert set(ours) == set(theirs)
    # Only the digest's reason differs: it names the chart's value instead of kustomize.
    assert {k: v for k, v in ours.items() if k != "CKV_K8S_43"} == {
        k: v for k, v in theirs.items() if k != "CKV_K8S_43"
    }
    assert "image.digest" in ours["CKV_K8S_43"]


def test_every_chart_object_carries_the_part_of_label(all_on: Rendered) -> None:
    for doc in all_on.docs:
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/part-of"] == "secrets-bridge", doc["kind"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm", doc["kind"]


# --- the notes ------------------------------------------------------------------------------


def test_notes_name_the_csidriver_check_the_audiences_and_the_metrics() -> None:
    text = notes({"gcp": {"project": "my-project", "location": "eu", "cluster": "c"}})
    assert "kubectl get csidriver secrets-store.csi.k8s.io -o yaml" in text
    for audience in (
        '"vault"',
        '"sts.amazonaws.com"',
        '"pods.eks.amazonaws.com"',
        '"api://AzureADTokenExchange"',
        '"my-project.svc.id.goog"',
    ):
        assert audience in text, audience
    assert "/metrics" in text and "8098" in text
    assert "rollout status daemonset/secrets-bridge" in text


def test_notes_list_only_the_audiences_of_the_backends_named() -> None:
    text = notes({"backends": ["vault"]})
    assert '"vault"' in text
    assert "sts.amazonaws.com" not in text and "AzureADTokenExchange" not in text
    assert "svc.id.goog" not in text


def test_notes_point_any_other_store_to_check() -> None:
    # A store the notes know nothing of (no chart edit for a new store): its audiences are
    # what `check --json` lists for a class.
    text = notes({"backends": ["vault", "somestore"]})
    assert '"vault"' in text
    assert 'somestore: the "audiences" of `secrets-bridge check --json <class.yaml>`' in text


def test_notes_give_the_gcp_pool_of_a_whole_audience() -> None:
    audience = "identitynamespace:pool.svc.id.goog:https://gkehub.googleapis.com/x"
    assert '"pool.svc.id.goog"' in notes(
        {"backends": ["gcp"], "gcp": {"workloadIdentityAudience": audience}}
    )


def test_notes_say_where_the_key_lives() -> None:
    assert "secrets-bridge/secrets-bridge-hmac" in notes()
    assert "Secret secrets-bridge/my-hmac" in notes({"hmacKey": {"existingSecret": "my-hmac"}})


def test_the_values_example_in_the_docs_installs() -> None:
    doc = (ROOT / "docs" / "deploy.md").read_text()
    (block,) = re.findall(r"```yaml\n\s*# my-values.yaml\n(.*?)```", doc, flags=re.S)
    values = yaml.safe_load(textwrap.dedent(block))
    assert values["vault"]["address"].startswith("https://")
    rendered = render(values)
    assert "--vault-addr=https://vault.example.internal:8200" in container(rendered)["args"]
    assert rendered.one("ServiceMonitor") and rendered.one("ConfigMap")
