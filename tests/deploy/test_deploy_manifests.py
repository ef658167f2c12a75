"""The kustomize base and the TokenRequest overlay, rendered: schema-valid, and the DaemonSet
has the security, resource and wiring properties docs/deploy.md describes."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from provider.cli.main import build_parser
from tests.deploy.conftest import Rendered, copy_deploy, kustomize

SOCKET_DIR = "/var/run/secrets-store-csi-providers"
KEY_PATH = "/etc/secrets-bridge/hmac/key"


def container(rendered: Rendered) -> dict[str, Any]:
    (c,) = rendered.one("DaemonSet")["spec"]["template"]["spec"]["containers"]
    return c


def pod_spec(rendered: Rendered) -> dict[str, Any]:
    spec: dict[str, Any] = rendered.one("DaemonSet")["spec"]["template"]["spec"]
    return spec


def volume_of(rendered: Rendered, mount_path: str) -> dict[str, Any]:
    (mount,) = [m for m in container(rendered)["volumeMounts"] if m["mountPath"] == mount_path]
    (volume,) = [v for v in pod_spec(rendered)["volumes"] if v["name"] == mount["name"]]
    return volume


@pytest.mark.parametrize("which", ["base", "overlay"])
def test_every_built_in_kind_is_valid_against_the_kubernetes_schema(
    which: str, request: pytest.FixtureRequest
) -> None:
    rendered: Rendered = request.getfixturevalue(which)
    version = kubernetes_validate.latest_version()
    errors = []
    for doc in rendered.docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(
                f"{doc['kind']}/{doc['metadata']['name']} at {list(exc.path)}: {exc.message}"
            )
    assert not errors, "\n".join(errors)


def test_base_holds_the_expected_objects_in_one_namespace(base: Rendered) -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"].split("-hmac-")[0]) for d in base.docs)
    assert kinds == [
        ("ClusterRole", "secrets-bridge"),
        ("ClusterRoleBinding", "secrets-bridge"),
        ("DaemonSet", "secrets-bridge"),
        ("Namespace", "secrets-bridge"),
        ("NetworkPolicy", "secrets-bridge"),
        ("ResourceQuota", "secrets-bridge-node-critical-pods"),
        ("Secret", "secrets-bridge"),
        ("ServiceAccount", "secrets-bridge"),
    ]
    namespaced = [d for d in base.docs if not d["kind"].startswith("Cluster")]
    assert {d["metadata"].get("namespace") for d in namespaced if d["kind"] != "Namespace"} == {
        "secrets-bridge"
    }
    # The driver's chart owns the CSIDriver; SecretProviderClasses are examples, not the install.
    assert not base.all("CSIDriver")
    assert not base.all("SecretProviderClass")


def test_container_runs_serve_with_the_socket_health_port_and_key_file(base: Rendered) -> None:
    c = container(base)
    args = c["args"]
    assert args[0] == "serve"
    assert f"--socket={SOCKET_DIR}/secrets-bridge.sock" in args
    assert "--health-addr=0.0.0.0:8098" in args
    assert f"--hmac-key-file={KEY_PATH}" in args
    assert "--token-request-fallback" not in args
    image = c["image"]
    assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), image
    assert c["imagePullPolicy"] == "IfNotPresent"


@pytest.mark.parametrize("which", ["base", "overlay"])
def test_container_args_are_flags_the_serve_command_accepts(
    which: str, request: pytest.FixtureRequest
) -> None:
    args = container(request.getfixturevalue(which))["args"]
    parsed = build_parser().parse_args(args)
    assert parsed.socket == f"{SOCKET_DIR}/secrets-bridge.sock", shlex.join(args)
    assert parsed.hmac_key_file == KEY_PATH


def test_probes_hit_healthz_and_readyz_on_port_8098(base: Rendered) -> None:
    c = container(base)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = c[probe]["httpGet"]
        assert get["path"] == path
        assert ports.get(get["port"], get["port"]) == 8098


def test_resources_request_50m_128mi_limit_256mi_memory_and_no_cpu(base: Rendered) -> None:
    resources = container(base)["resources"]
    assert resources["requests"] == {"cpu": "50m", "memory": "128Mi"}
    assert resources["limits"] == {"memory": "256Mi"}


def test_container_is_locked_down(base: Rendered) -> None:
    sc = container(base)["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc.get("privileged", False) is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod_spec(base)["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    spec = pod_spec(base)
    for shared in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(shared, False), shared


def test_runs_as_root_only_with_the_reason_beside_each_skipped_check(base: Rendered) -> None:
    # uid 0 is a decision (root-owned socket directory), so it must come with its reasons.
    assert container(base)["securityContext"]["runAsUser"] == 0
    annotations = base.one("DaemonSet")["metadata"]["annotations"]
    skips = {v.split("=", 1)[0] for k, v in annotations.items() if k.startswith("checkov.io/skip")}
    assert {"CKV_K8S_23", "CKV_K8S_40"} <= skips


def test_socket_directory_is_the_host_path_at_the_same_path(base: Rendered) -> None:
    volume = volume_of(base, SOCKET_DIR)
    assert volume["hostPath"] == {"path": SOCKET_DIR, "type": "DirectoryOrCreate"}
    (mount,) = [m for m in container(base)["volumeMounts"] if m["mountPath"] == SOCKET_DIR]
    assert not mount.get("readOnly", False)


def test_hmac_key_is_a_generated_secret_mounted_read_only_as_a_file(base: Rendered) -> None:
    volume = volume_of(base, str(Path(KEY_PATH).parent))
    secret = base.one("Secret")
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert secret["metadata"]["name"].startswith("secrets-bridge-hmac-")
    assert set(secret["data"]) == {"key"}
    assert volume["secret"]["defaultMode"] == 0o400
    (mount,) = [m for m in container(base)["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True


def test_without_a_generated_key_kustomize_refuses_to_render(tmp_path: Path) -> None:
    # No key in the repository: a fixed, published key would turn versions into plain hashes.
    result = kustomize(copy_deploy(tmp_path, with_key=False))
    assert result.returncode != 0
    assert "hmac.key" in result.stderr


def test_tmp_is_a_small_memory_scratch_volume(base: Rendered) -> None:
    assert volume_of(base, "/tmp")["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Mi"}


def test_scheduled_on_every_linux_node_as_node_critical(base: Rendered) -> None:
    spec = pod_spec(base)
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert {"operator": "Exists"} in spec["tolerations"]
    assert spec["priorityClassName"] == "system-node-critical"
    # ...admitted outside kube-system where critical pods need a quota (GKE).
    scope = base.one("ResourceQuota")["spec"]["scopeSelector"]["matchExpressions"]
    assert scope == [
        {"scopeName": "PriorityClass", "operator": "In", "values": ["system-node-critical"]}
    ]
    grace = float(next(a for a in container(base)["args"] if a.startswith("--grace-period="))[15:])
    assert spec["terminationGracePeriodSeconds"] > grace


def test_base_rbac_only_reads_serviceaccounts(base: Rendered) -> None:
    (role,) = base.all("ClusterRole")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["get"]}
    ]
    (binding,) = base.all("ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "secrets-bridge", "namespace": "secrets-bridge"}
    ]
    assert pod_spec(base)["serviceAccountName"] == "secrets-bridge"


def test_overlay_adds_token_creation_and_the_fallback_flag(
    base: Rendered, overlay: Rendered
) -> None:
    rules = [r for role in overlay.all("ClusterRole") for r in role["rules"]]
    assert {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]} in rules
    assert container(overlay)["args"] == [*container(base)["args"], "--token-request-fallback"]
    bound = {b["roleRef"]["name"] for b in overlay.all("ClusterRoleBinding")}
    assert bound == {r["metadata"]["name"] for r in overlay.all("ClusterRole")}


def test_namespace_enforces_privileged_only_for_the_host_path(base: Rendered) -> None:
    labels = base.one("Namespace")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["pod-security.kubernetes.io/audit"] == "restricted"


def test_network_policy_admits_only_the_health_port(base: Rendered) -> None:
    # ... and only from the monitoring namespace: tests/deploy/test_deploy_networkpolicy.py.
    policy = base.one("NetworkPolicy")["spec"]
    pod_labels = base.one("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["policyTypes"] == ["Ingress"]
    assert [rule["ports"] for rule in policy["ingress"]] == [[{"protocol": "TCP", "port": 8098}]]
