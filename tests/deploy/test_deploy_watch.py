"""The change feed's deployment (docs/change-feed.md): the chart's `watch.enabled` and
`changeFeed` values and the kustomize component deploy/components/change-feed, rendered,
validated (kubernetes-validate, checkov) and compared with each other."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from tests.deploy.conftest import Rendered, render
from tests.deploy.helm_render import NAMESPACE, lint, refusal
from tests.deploy.helm_render import render as helm
from tests.deploy.test_deploy_checkov import DECIDED_SKIPS
from tests.deploy.test_deploy_helm import (
    _base_daemonset_spec,
    _bodies,
    _checkov,
    _without_helm_labels,
)

WATCH = "secrets-bridge-watch"
NODE_ROLE = "secrets-bridge-change-feed"
AUDIT = "secrets-bridge-watch-audit"

#: Every event source set, as an installation using all four stores would.
SOURCES: dict[str, Any] = {
    "vault": {
        "auditListen": "0.0.0.0:9200",
        "address": "https://vault.example.internal:8200",
        "canaryTokenSecret": "vault-canary",
    },
    "aws": {
        "queueUrl": "https://sqs.eu-west-1.amazonaws.com/111122223333/q",
        "region": "eu-west-1",
    },
    "azure": {
        "queueUrl": "https://acct.queue.core.windows.net/kv-events",
        "vaults": ["kv-a", "kv-b"],
    },
    "gcp": {
        "subscription": "projects/p/subscriptions/sm-events",
        "projects": ["my-project", "123"],
    },
}
ON: dict[str, Any] = {"watch": {"enabled": True, **SOURCES}}

#: The watcher's arguments whatever the sources.
FIXED_ARGS = [
    "watch",
    "--namespace=$(POD_NAMESPACE)",
    "--identity=$(POD_NAME)",
    "--heartbeat=30",
    "--metrics-address=0.0.0.0:9102",
]
#: The provider's defaults (3600 s window, 90 s staleness) add no flag, as every chart value.
NODE_ARGS = ["--change-feed"]
#: The watcher's checkov skips, each with its reason on the Deployment (as the provider's).
WATCH_SKIPS = {"CKV_K8S_11", "CKV_K8S_15", "CKV_K8S_38", "CKV_K8S_43"}
#: The kinds the component adds or changes, compared between the chart and kustomize.
KINDS = ("Deployment", "ServiceAccount", "Role", "RoleBinding", "PodDisruptionBudget")
KINDS += ("NetworkPolicy", "Service", "ClusterRole", "ClusterRoleBinding")


@pytest.fixture(scope="module")
def off() -> Rendered:
    return helm()


@pytest.fixture(scope="module")
def on() -> Rendered:
    return helm(ON)


@pytest.fixture(scope="module")
def plain() -> Rendered:
    return helm({"watch": {"enabled": True}})


@pytest.fixture(scope="module")
def audit() -> Rendered:
    return helm({"watch": {"enabled": True, "vault": {"auditListen": "0.0.0.0:9200"}}})


def _kustomization(deploy: Path, name: str, components: list[str]) -> Rendered:
    """deploy/ (a copy) with the base and these components, as an installation lists them."""
    directory = deploy / name
    directory.mkdir(exist_ok=True)
    listed = "".join(f"  - ../components/{c}\n" for c in components)
    (directory / "kustomization.yaml").write_text("resources:\n  - ../base\ncomponents:\n" + listed)
    return render(directory)


@pytest.fixture(scope="module")
def component(deploy_copy: Path) -> Rendered:
    return _kustomization(deploy_copy, "feed", ["change-feed"])


@pytest.fixture(scope="module")
def component_audit(deploy_copy: Path) -> Rendered:
    return _kustomization(deploy_copy, "feed-audit", ["change-feed", "change-feed/vault-audit"])


def named(rendered: Rendered, kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in rendered.all(kind) if d["metadata"]["name"] == name]
    return found


def pod(rendered: Rendered, kind: str = "Deployment") -> dict[str, Any]:
    spec: dict[str, Any] = rendered.one(kind)["spec"]["template"]["spec"]
    return spec


def watcher(rendered: Rendered) -> dict[str, Any]:
    (c,) = pod(rendered)["containers"]
    found: dict[str, Any] = c
    return found


def provider(rendered: Rendered) -> dict[str, Any]:
    (c,) = pod(rendered, "DaemonSet")["containers"]
    found: dict[str, Any] = c
    return found


def rules(rendered: Rendered, name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = named(rendered, "Role", name)["rules"]
    return found


# --- off by default -------------------------------------------------------------------------


def test_off_renders_nothing_of_the_feed(off: Rendered) -> None:
    assert not [d for d in off.docs if "watch" in d["metadata"]["name"]]
    assert not off.all("Deployment") and not off.all("Role") and not off.all("RoleBinding")
    assert not off.all("PodDisruptionBudget")
    provider_args = provider(off)["args"]
    assert not [a for a in provider_args if "feed" in a], provider_args
    assert "env" not in provider(off)


# --- the watcher ----------------------------------------------------------------------------


def test_on_renders_the_watcher_and_the_nodes_side(on: Rendered, off: Rendered) -> None:
    added = {(d["kind"], d["metadata"]["name"]) for d in on.docs} - {
        (d["kind"], d["metadata"]["name"]) for d in off.docs
    }
    assert added == {
        ("Deployment", WATCH),
        ("ServiceAccount", WATCH),
        ("Role", WATCH),
        ("RoleBinding", WATCH),
        ("PodDisruptionBudget", WATCH),
        ("NetworkPolicy", WATCH),
        ("Service", AUDIT),
        ("Role", NODE_ROLE),
        ("RoleBinding", NODE_ROLE),
    }
    for doc in on.docs:
        if (doc["kind"], doc["metadata"]["name"]) in added:
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["kind"]
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "secrets-bridge"


#: (values of one source, the flags it adds to the watcher's).
PER_SOURCE: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "vault",
        SOURCES["vault"],
        [
            "--vault-audit-listen=0.0.0.0:9200",
            "--vault-address=https://vault.example.internal:8200",
            "--vault-canary-token-file=/var/run/secrets-bridge/vault-canary/token",
        ],
    ),
    (
        "aws",
        SOURCES["aws"],
        [f"--aws-queue-url={SOURCES['aws']['queueUrl']}", "--aws-region=eu-west-1"],
    ),
    (
        "azure",
        SOURCES["azure"],
        [f"--azure-queue-url={SOURCES['azure']['queueUrl']}", "--azure-vaults=kv-a,kv-b"],
    ),
    (
        "gcp",
        SOURCES["gcp"],
        [
            "--gcp-subscription=projects/p/subscriptions/sm-events",
            "--gcp-projects=my-project,123",
        ],
    ),
]


@pytest.mark.parametrize(
    ("store", "values", "flags"), PER_SOURCE, ids=[s for s, _, _ in PER_SOURCE]
)
def test_each_source_adds_exactly_its_flags(
    store: str, values: dict[str, Any], flags: list[str]
) -> None:
    rendered = helm({"watch": {"enabled": True, store: values, "extraArgs": ["--log-level=debug"]}})
    assert watcher(rendered)["args"] == [*FIXED_ARGS, *flags, "--log-level=debug"]


def test_without_sources_the_watcher_gets_only_its_fixed_flags(plain: Rendered) -> None:
    assert watcher(plain)["args"] == FIXED_ARGS


def test_watcher_runs_the_providers_image_with_its_own_identity(on: Rendered) -> None:
    c = watcher(on)
    assert c["image"] == provider(on)["image"]
    assert c["imagePullPolicy"] == provider(on)["imagePullPolicy"]
    assert c["env"] == [
        {"name": n, "valueFrom": {"fieldRef": {"fieldPath": f}}}
        for n, f in (
            ("POD_NAMESPACE", "metadata.namespace"),
            ("POD_NAME", "metadata.name"),
            ("POD_IP", "status.podIP"),  # the audit EndpointSlice's address
        )
    ]
    assert pod(on)["serviceAccountName"] == WATCH
    values = {"watch": {"enabled": True, "serviceAccount": {"annotations": {"a/b": "c"}}}}
    sa = named(helm(values), "ServiceAccount", WATCH)
    assert sa["metadata"]["annotations"] == {"a/b": "c"}


def test_watcher_is_restricted_and_small(on: Rendered) -> None:
    spec, c = pod(on), watcher(on)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["securityContext"] == {
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "runAsNonRoot": True,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert c["resources"] == {
        "requests": {"cpu": "50m", "memory": "64Mi"},
        "limits": {"memory": "128Mi"},
    }
    assert spec["terminationGracePeriodSeconds"] == 30
    assert on.one("Deployment")["spec"]["replicas"] == 2


def test_probes_and_metrics_on_the_metrics_port(on: Rendered) -> None:
    c = watcher(on)
    assert {"name": "metrics", "containerPort": 9102, "protocol": "TCP"} in c["ports"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


def test_replicas_spread_over_nodes_and_the_budget_keeps_one(on: Rendered) -> None:
    deployment = on.one("Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    (by_node,) = [
        t
        for t in pod(on)["topologySpreadConstraints"]
        if t["topologyKey"] == "kubernetes.io/hostname"
    ]
    assert by_node["whenUnsatisfiable"] == "DoNotSchedule" and by_node["maxSkew"] == 1
    assert by_node["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    budget = on.one("PodDisruptionBudget")["spec"]
    assert budget["maxUnavailable"] == 1
    assert budget["selector"]["matchLabels"].items() <= pod_labels.items()
    # Neither workload's selector takes in the other's pods.
    daemonset = on.one("DaemonSet")["spec"]
    assert not daemonset["selector"]["matchLabels"].items() <= pod_labels.items()
    assert not (
        deployment["spec"]["selector"]["matchLabels"].items()
        <= daemonset["template"]["metadata"]["labels"].items()
    )


def test_canary_token_is_a_secret_mounted_read_only_as_a_file(on: Rendered) -> None:
    (volume,) = [v for v in pod(on)["volumes"] if v["name"] == "vault-canary"]
    assert volume["secret"] == {
        "secretName": "vault-canary",
        "defaultMode": 0o440,
        "items": [{"key": "token", "path": "token"}],
    }
    assert {
        "name": "vault-canary",
        "mountPath": "/var/run/secrets-bridge/vault-canary",
        "readOnly": True,
    } in watcher(on)["volumeMounts"]


# --- RBAC: exactly these verbs --------------------------------------------------------------

LEASE_RULES = [
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": [WATCH],
        "verbs": ["get", "update"],
    },
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "verbs": ["get", "list", "watch", "create", "update"],
    },
]
SLICE_RULES = [
    {
        "apiGroups": ["discovery.k8s.io"],
        "resources": ["endpointslices"],
        "resourceNames": [AUDIT],
        "verbs": ["get", "update"],
    },
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["create"]},
]
NODE_RULES = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]


@pytest.mark.parametrize("which", ["plain", "audit", "component", "component_audit"])
def test_rbac_is_exactly_the_listed_verbs(which: str, request: pytest.FixtureRequest) -> None:
    rendered: Rendered = request.getfixturevalue(which)
    slices = SLICE_RULES if "audit" in which else []
    assert rules(rendered, WATCH) == [*LEASE_RULES, *slices]
    assert rules(rendered, NODE_ROLE) == NODE_RULES
    for name, account in ((WATCH, WATCH), (NODE_ROLE, "secrets-bridge")):
        binding = named(rendered, "RoleBinding", name)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": name,
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
        ]
    # No Secret, and no cluster-scoped right beyond the provider's own.
    granted = {r for d in rendered.all("Role") for rule in d["rules"] for r in rule["resources"]}
    assert granted == {"leases", "configmaps", *(["endpointslices"] if slices else [])}
    assert [d["metadata"]["name"] for d in rendered.all("ClusterRole")] == ["secrets-bridge"]


# --- Vault's audit stream -------------------------------------------------------------------


def test_audit_service_has_no_selector_and_the_listeners_port() -> None:
    rendered = helm({"watch": {"enabled": True, "vault": {"auditListen": "[::]:9300"}}})
    service = rendered.one("Service")
    assert service["metadata"]["name"] == AUDIT
    assert "selector" not in service["spec"]
    assert service["spec"]["ports"] == [
        {"name": "audit", "port": 9300, "targetPort": 9300, "protocol": "TCP"}
    ]
    assert {"name": "audit", "containerPort": 9300, "protocol": "TCP"} in watcher(rendered)["ports"]
    assert "--vault-audit-listen=[::]:9300" in watcher(rendered)["args"]


def test_network_policy_admits_the_scrapers_and_the_audit_stream(
    plain: Rendered, audit: Rendered
) -> None:
    scrapers = {
        "from": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        ],
        "ports": [{"protocol": "TCP", "port": 9102}],
    }
    any_source = {"ports": [{"protocol": "TCP", "port": 9200}]}
    policy = named(plain, "NetworkPolicy", WATCH)["spec"]
    assert (
        policy["podSelector"]["matchLabels"]
        == plain.one("Deployment")["spec"]["selector"]["matchLabels"]
    )
    assert policy["ingress"] == [scrapers]
    assert named(audit, "NetworkPolicy", WATCH)["spec"]["ingress"] == [scrapers, any_source]
    vault = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "vault"}}}]
    narrowed = helm(
        {"watch": {"enabled": True, "vault": {"auditListen": "0.0.0.0:9200", "auditFrom": vault}}}
    )
    assert named(narrowed, "NetworkPolicy", WATCH)["spec"]["ingress"][1] == {
        **any_source,
        "from": vault,
    }
    closed = helm({"watch": {"enabled": True}, "metrics": {"allowFrom": []}})
    assert named(closed, "NetworkPolicy", WATCH)["spec"]["ingress"] == []
    left_out = helm({"watch": {"enabled": True}, "networkPolicy": {"enabled": False}})
    assert not left_out.all("NetworkPolicy")


# --- the nodes' side ------------------------------------------------------------------------


def test_nodes_read_the_feed_with_the_window_and_staleness(on: Rendered) -> None:
    c = provider(on)
    assert c["args"][-1:] == NODE_ARGS
    assert c["env"] == [
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
    ]
    tuned = helm({"watch": {"enabled": True}, "changeFeed": {"window": 7200, "staleAfter": 45}})
    assert provider(tuned)["args"][-3:] == [
        *NODE_ARGS,
        "--feed-window=7200",
        "--feed-stale-after=45",
    ]


def test_nodes_side_follows_change_feed_enabled_apart_from_the_watcher() -> None:
    elsewhere = helm({"changeFeed": {"enabled": True}})
    assert provider(elsewhere)["args"][-1:] == NODE_ARGS
    assert rules(elsewhere, NODE_ROLE) == NODE_RULES
    assert not elsewhere.all("Deployment")
    without = helm({"watch": {"enabled": True}, "changeFeed": {"enabled": False}})
    assert without.all("Deployment")
    assert [r["metadata"]["name"] for r in without.all("Role")] == [WATCH]
    assert not [a for a in provider(without)["args"] if "feed" in a]


def test_nodes_namespace_variable_is_not_set_twice() -> None:
    env = [{"name": "POD_NAMESPACE", "value": "elsewhere"}]
    rendered = helm({"watch": {"enabled": True}, "extraEnv": env})
    assert provider(rendered)["env"] == env


# --- validity -------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["on", "plain", "component", "component_audit"])
def test_valid_against_the_kubernetes_schema(which: str, request: pytest.FixtureRequest) -> None:
    rendered: Rendered = request.getfixturevalue(which)
    version = kubernetes_validate.latest_version()
    for doc in rendered.docs:
        # The first invalid object fails the test, its path and reason in the message.
        kubernetes_validate.validate(doc, version, strict=True)


def test_lint_strict_finds_no_error_and_no_warning() -> None:
    report = lint(ON)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("listener without a port", {"vault": {"auditListen": "0.0.0.0"}}, "/watch/vault/auditListen"),
    ("queue url without a scheme", {"aws": {"queueUrl": "sqs/q"}}, "/watch/aws/queueUrl"),
    ("vaults as one string", {"azure": {"vaults": "a,b"}}, "/watch/azure/vaults"),
    ("subscription without its project", {"gcp": {"subscription": "s"}}, "/watch/gcp/subscription"),
    ("zero replicas", {"replicas": 0}, "/watch/replicas"),
    ("unknown source", {"kafka": {}}, "'kafka' not allowed"),
]


@pytest.mark.parametrize(
    ("values", "message"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_bad_watch_values_are_refused(values: dict[str, Any], message: str) -> None:
    assert message in refusal({"watch": {"enabled": True, **values}})


def test_bad_feed_values_are_refused() -> None:
    assert "/changeFeed/window" in refusal({"changeFeed": {"window": 0}})
    late = {"watch": {"enabled": True, "heartbeat": 90}}
    assert "watch.heartbeat (90) must be below changeFeed.staleAfter (90)" in refusal(late)


# --- the chart and the component are the same objects ---------------------------------------


@pytest.mark.parametrize(
    ("chart", "kustomized"), [("plain", "component"), ("audit", "component_audit")]
)
def test_chart_is_the_component(
    chart: str, kustomized: str, request: pytest.FixtureRequest
) -> None:
    ours: Rendered = request.getfixturevalue(chart)
    theirs: Rendered = request.getfixturevalue(kustomized)
    assert _bodies(ours, *KINDS) == _bodies(theirs, *KINDS)
    assert _without_helm_labels(ours.one("DaemonSet")["spec"]) == _base_daemonset_spec(theirs)


# --- checkov --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkov_report(
    on: Rendered, component_audit: Rendered, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    scan = tmp_path_factory.mktemp("checkov-watch")
    (scan / "chart.yaml").write_text(on.text)
    (scan / "component.yaml").write_text(component_audit.text)
    return _checkov(scan)


def test_checkov_finds_no_failed_check_and_skips_only_decided_ones(checkov_report: Any) -> None:
    failed = checkov_report["results"]["failed_checks"]
    assert not failed, "\n".join(f"{c['check_id']} {c['resource']}" for c in failed)
    assert checkov_report["summary"]["parsing_errors"] == 0
    assert checkov_report["summary"]["passed"] > 50, "checkov checked next to nothing"
    skipped: dict[tuple[str, str], set[str]] = {}
    for check in checkov_report["results"]["skipped_checks"]:
        assert len(check["check_result"].get("suppress_comment", "")) > 20, check["check_id"]
        where = (Path(check["file_path"]).name, check["resource"].split(".")[0])
        skipped.setdefault(where, set()).add(check["check_id"])
    for name in ("chart.yaml", "component.yaml"):
        assert skipped[(name, "Deployment")] == WATCH_SKIPS
        assert skipped[(name, "DaemonSet")] == DECIDED_SKIPS


def test_the_watchers_arguments_are_what_secrets_bridge_watch_parses(on: Rendered) -> None:
    """Each source's chart values become flags the real `watch` parser takes and turns into
    that source, the downward API's variables substituted as the kubelet does."""
    from provider.cli import watch as watching
    from provider.cli.main import build_parser

    env = {"POD_NAMESPACE": "secrets-bridge", "POD_NAME": "secrets-bridge-watch-0"}
    names = {e["name"] for e in watcher(on)["env"]}
    assert {"POD_NAMESPACE", "POD_NAME", "POD_IP"} <= names
    args = [a.replace("$(POD_NAMESPACE)", env["POD_NAMESPACE"]) for a in watcher(on)["args"]]
    args = [a.replace("$(POD_NAME)", env["POD_NAME"]) for a in args]
    parsed = build_parser("watch").parse_args(args)
    settings = watching.settings_from_args(parsed)
    assert settings.namespace == "secrets-bridge"
    assert settings.identity == "secrets-bridge-watch-0"
    stores = {spec.store: spec for spec in settings.sources}
    assert set(stores) == {"vault", "aws", "azure", "gcp"}
    assert stores["vault"].port == 9200
    assert stores["vault"].options["token_file"] == "/var/run/secrets-bridge/vault-canary/token"
    assert stores["azure"].options["vaults"] == ["kv-a", "kv-b"]
    assert stores["gcp"].options["projects"] == ["my-project", "123"]
