"""deploy/loadtest rendered: a schema-valid Job whose bench flags parse, whose socket is the
node's provider socket directory, whose every --token file is a projected token of that
audience, and whose --class file is the generated ConfigMap's valid SecretProviderClass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from provider.cli import spc
from provider.cli.main import build_parser
from tests.deploy.conftest import DEPLOY, Rendered, render

SOCKET_DIR = "/var/run/secrets-store-csi-providers"


@pytest.fixture(scope="module")
def loadtest() -> Rendered:
    return render(DEPLOY / "loadtest")


def job_pod(rendered: Rendered) -> dict[str, Any]:
    spec: dict[str, Any] = rendered.one("Job")["spec"]["template"]["spec"]
    return spec


def bench_args(rendered: Rendered) -> Any:
    (c,) = job_pod(rendered)["containers"]
    return build_parser("bench").parse_args(c["args"])


def volume_at(rendered: Rendered, path: str) -> dict[str, Any]:
    """The volume mounted at the directory holding `path`."""
    pod = job_pod(rendered)
    (c,) = pod["containers"]
    (mount,) = [m for m in c["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    return {**volume, "_subpath": path[len(mount["mountPath"]) + 1 :]}


def test_every_object_is_valid_against_the_kubernetes_schema(loadtest: Rendered) -> None:
    version = kubernetes_validate.latest_version()
    for doc in loadtest.docs:
        kubernetes_validate.validate(doc, version, strict=True)
    kinds = sorted(d["kind"] for d in loadtest.docs)
    assert kinds == ["ConfigMap", "Job", "NetworkPolicy", "ServiceAccount"]
    assert {d["metadata"]["namespace"] for d in loadtest.docs} == {"secrets-bridge"}


def test_the_job_runs_bench_against_the_nodes_provider_socket(loadtest: Rendered) -> None:
    args = bench_args(loadtest)
    assert args.command == "bench"
    assert args.socket == f"{SOCKET_DIR}/secrets-bridge.sock"
    volume = volume_at(loadtest, args.socket)
    assert volume["hostPath"] == {"path": SOCKET_DIR, "type": "Directory"}
    job = loadtest.one("Job")["spec"]
    assert job["backoffLimit"] == 0 and job_pod(loadtest)["restartPolicy"] == "Never"
    # Not the dev kit's rigs: the image has none.
    assert args.store is None and args.classes


def test_each_token_flag_reads_a_projected_token_of_its_audience(loadtest: Rendered) -> None:
    args = bench_args(loadtest)
    assert args.token
    for item in args.token:
        audience, _, path = item.partition("=")
        volume = volume_at(loadtest, path)
        sources = [s["serviceAccountToken"] for s in volume["projected"]["sources"]]
        assert {"audience": audience, "path": volume["_subpath"]}.items() <= next(
            s for s in sources if s["path"] == volume["_subpath"]
        ).items()
    sa = loadtest.one("ServiceAccount")["metadata"]["name"]
    assert job_pod(loadtest)["serviceAccountName"] == sa
    # The identity the requests claim is the one the projected token is for.
    assert args.service_accounts == sa and args.namespace == "secrets-bridge"


def test_the_class_file_is_the_configmaps_valid_secretproviderclass(
    loadtest: Rendered, tmp_path: Path
) -> None:
    (item,) = bench_args(loadtest).classes
    volume = volume_at(loadtest, item)
    configmap = loadtest.one("ConfigMap")
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    text = configmap["data"][volume["_subpath"]]
    (tmp_path / "class.yaml").write_text(text)
    (cls,) = spc.load(str(tmp_path / "class.yaml"))
    assert cls.provider == "secrets-bridge" and cls.parameters["backend"]


def test_the_container_is_locked_down_and_has_a_writable_tmp(loadtest: Rendered) -> None:
    pod = job_pod(loadtest)
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert pod["automountServiceAccountToken"] is False
    assert volume_at(loadtest, "/tmp/x")["emptyDir"]["medium"] == "Memory"
    assert c["resources"]["limits"]["memory"]
    for shared in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(shared, False)


def test_the_bench_pod_alone_may_read_the_providers_metrics(loadtest: Rendered) -> None:
    # The base admits the health port from the monitoring namespace only (issue 32); --metrics-url
    # needs the bench's own pod admitted too, and nothing else.
    policy = loadtest.one("NetworkPolicy")["spec"]
    bench_labels = loadtest.one("Job")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "secrets-bridge"}}
    assert policy["policyTypes"] == ["Ingress"]
    ((rule,),) = [policy["ingress"]]
    ((peer,),) = [rule["from"]]
    assert set(peer) == {"podSelector"}  # this namespace's pods with the bench's labels
    assert peer["podSelector"]["matchLabels"].items() <= bench_labels.items()
    assert rule["ports"] == [{"protocol": "TCP", "port": 8098}]
