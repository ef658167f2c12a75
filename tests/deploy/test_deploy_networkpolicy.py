"""The provider's NetworkPolicy, in the kustomize base, its overlay and the Helm chart (issue 32).

/metrics counts every namespace's mounts, errors and store calls over time, so the health port
admits only what the installation names (Prometheus; by default the pods of the namespace named
"monitoring"), never every pod. The kubelet's probes come from the node: the pod is not on the
host network, and a NetworkPolicy does not filter traffic from the pod's own node (Kubernetes'
NetworkPolicy documentation, "What you can't do with network policies"), so no rule is needed for
them, and none is written that would open the port to pods.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.conftest import DEPLOY, Rendered, copy_deploy, render
from tests.deploy.helm_render import notes, refusal
from tests.deploy.helm_render import render as helm_render

MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
HEALTH = [{"protocol": "TCP", "port": 8098}]


def policy(rendered: Rendered) -> dict[str, Any]:
    spec: dict[str, Any] = rendered.one("NetworkPolicy")["spec"]
    return spec


def admits_every_pod(rule: dict[str, Any]) -> bool:
    """A rule with no `from` (or an empty one) admits every source; so does a peer selecting
    every namespace without narrowing the pods."""
    peers = rule.get("from") or []
    return not peers or any(
        p.get("namespaceSelector") == {} and not p.get("podSelector") and "ipBlock" not in p
        for p in peers
    )


def probes_reach(rendered: Rendered, port: int) -> None:
    """The probes ask the port the policy names, from the node: the pod is not hostNetwork."""
    spec = rendered.one("DaemonSet")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        named = container[probe]["httpGet"]["port"]
        assert ports.get(named, named) == port, probe
    assert not spec.get("hostNetwork", False)


@pytest.fixture(scope="module")
def chart_default() -> Rendered:
    return helm_render()


# --- kustomize ------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["base", "overlay"])
def test_kustomize_admits_the_health_port_only_from_the_monitoring_namespace(
    which: str, request: pytest.FixtureRequest
) -> None:
    rendered: Rendered = request.getfixturevalue(which)
    spec = policy(rendered)
    pod_labels = rendered.one("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert spec["policyTypes"] == ["Ingress"]  # egress stays open: the stores are anywhere
    assert spec["ingress"] == [{"from": [MONITORING], "ports": HEALTH}]
    assert not any(admits_every_pod(rule) for rule in spec["ingress"])
    probes_reach(rendered, 8098)


def _documented_patch() -> dict[str, Any]:
    """The overlay patch deploy/base/networkpolicy.yaml's comment offers, as YAML."""
    lines = (DEPLOY / "base" / "networkpolicy.yaml").read_text().splitlines()
    block = [line[4:] for line in lines if line.startswith("#   ")]
    loaded: dict[str, Any] = yaml.safe_load("\n".join(block))
    return loaded


def test_the_documented_overlay_patch_names_another_prometheus(tmp_path: Path) -> None:
    deploy = copy_deploy(tmp_path, with_key=True)
    overlay = deploy / "overlays" / "my-prometheus"
    overlay.mkdir()
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["../../base"],
        **_documented_patch(),
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    spec = policy(render(overlay))
    assert spec["ingress"] == [
        {
            "from": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": "observability"}
                    },
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
                }
            ],
            "ports": HEALTH,
        }
    ]


# --- the Helm chart -------------------------------------------------------------------------


def test_chart_renders_the_policy_by_default_and_it_is_the_bases(
    chart_default: Rendered, base: Rendered
) -> None:
    ours, theirs = policy(chart_default), policy(base)
    assert ours["ingress"] == theirs["ingress"] == [{"from": [MONITORING], "ports": HEALTH}]
    assert ours["policyTypes"] == theirs["policyTypes"]
    probes_reach(chart_default, 8098)


PEERS = [
    {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    },
    {
        "namespaceSelector": {
            "matchExpressions": [{"key": "team", "operator": "In", "values": ["sre"]}]
        }
    },
    {"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.5.0/24"]}},
]


def test_chart_admits_exactly_the_named_peers_on_the_health_port() -> None:
    rendered = helm_render({"healthPort": 9100, "metrics": {"allowFrom": PEERS}})
    spec = policy(rendered)
    assert spec["ingress"] == [{"from": PEERS, "ports": [{"protocol": "TCP", "port": 9100}]}]
    probes_reach(rendered, 9100)
    kubernetes_validate.validate(
        rendered.one("NetworkPolicy"), kubernetes_validate.latest_version(), strict=True
    )


def test_chart_with_no_peers_admits_no_pod() -> None:
    # Never a rule without `from`, which would admit every pod.
    rendered = helm_render({"metrics": {"allowFrom": []}})
    assert policy(rendered)["ingress"] == []
    kubernetes_validate.validate(
        rendered.one("NetworkPolicy"), kubernetes_validate.latest_version(), strict=True
    )


def test_chart_policy_can_be_left_out() -> None:
    assert not helm_render({"networkPolicy": {"enabled": False}}).all("NetworkPolicy")


@pytest.mark.parametrize(
    ("peer", "why"),
    [
        ({}, "an empty peer"),
        ({"namespace": "monitoring"}, "an unknown key"),
        ("monitoring", "a string"),
        ({"namespaceSelector": {"matchLabels": {"a": 1}}}, "a label value not a string"),
        ({"namespaceSelector": {"matchNames": ["monitoring"]}}, "not a label selector"),
        (
            {"ipBlock": {"cidr": "10.0.0.0/8"}, "namespaceSelector": {}},
            "ipBlock with a selector",
        ),
        ({"podSelector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}}, "operator"),
    ],
)
def test_chart_refuses_a_malformed_peer(peer: Any, why: str) -> None:
    message = refusal({"metrics": {"allowFrom": [peer]}})
    assert "/metrics/allowFrom/0" in message, why


def test_values_document_the_default_and_how_to_name_prometheus() -> None:
    values = (DEPLOY / "helm" / "secrets-bridge" / "values.yaml").read_text()
    loaded = yaml.safe_load(values)
    assert loaded["networkPolicy"]["enabled"] is True
    assert loaded["metrics"]["allowFrom"] == [MONITORING]
    comment = values.split("metrics:\n", 1)[1].split("allowFrom:", 1)[0]
    for needle in ("namespaceSelector", "podSelector", "ipBlock", "[] admits no pod"):
        assert needle in textwrap.dedent(comment), needle


def test_notes_say_who_may_reach_the_port() -> None:
    assert "admits the port only from metrics.allowFrom" in notes()
    assert "admits no pod to the port" in notes({"metrics": {"allowFrom": []}})
    assert "NetworkPolicy" not in notes({"networkPolicy": {"enabled": False}})
