"""The secrets-store-sync-controller as a caller (docs/sync-controller.md): Mount requests built
exactly as kubernetes-sigs/secrets-store-sync-controller builds them, sent to a provider serving
on a Unix socket, against a real OpenBao.

What the controller sends (internal/controller/secretsync_controller.go, prepareCSIProviderParams
and fetchSecretsFromProvider; pkg/provider/provider_client.go, MountContent; pkg/token/
token_manager.go, SecretProviderServiceAccountTokenAttrs):

- attributes: the SecretProviderClass's parameters, then `csi.storage.k8s.io/pod.name` and
  `pod.uid` = the controller's OWN pod (its downward-API env SYNC_CONTROLLER_POD_NAME/_UID, ""
  when unset), `pod.namespace` = the SecretSync's namespace, `serviceAccount.name` = the
  SecretSync's spec.serviceAccountName, and, when the controller runs with
  --token-request-audience, `serviceAccount.tokens`: one TokenRequest per audience for that
  service account, 600 s, NOT bound to any pod. No `secretProviderClass`, no `ephemeral`.
- secrets: always `{}`; target_path: always the placeholder "/mnt/secrets-store";
  permission: "420"; current_object_version: empty.
- Dial: insecure over `<--provider-volume>/<spec.provider>.sock`, waitForReady, UNAVAILABLE
  retried (3 attempts), 4 MiB receive limit, no deadline (the reconcile's context has none).
- The answer: an error code or no object versions fails the sync; each SecretSync
  `data[].sourcePath` must name a file path of the answer, whose contents become the Secret's
  `targetKey`. Modes and versions are otherwise dropped; rotation compares a hash of the data.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import jwt
import kubernetes_validate
import pytest
import yaml

from backends.vault.options import Options as VaultOptions
from devkit.kube import TokenReviewStub
from devkit.openbao import OpenBao, read_policy
from devkit.serving import serving
from devkit.tokens import SigningKey
from protos import provider_pb2, provider_pb2_grpc
from provider.core.settings import CoreSettings
from tests.deploy.conftest import ROOT, render

#: The controller's pod, as its downward-API env gives it (one for every SecretSync).
CONTROLLER_POD = "secrets-store-sync-controller-manager-7d9f8b6c5-x2x7q"
CONTROLLER_UID = "0b6a9c7e-3f51-4e2a-9d0c-5e8f2a1b7c44"
#: pkg/provider/provider_client.go: the placeholder it sends as the target path.
TARGET_PATH = "/mnt/secrets-store"
#: pkg/provider/provider_client.go ServiceConfig, as gRPC's JSON spells it.
SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": "v1alpha1.CSIDriverProvider"}],
                "waitForReady": True,
                "retryPolicy": {
                    "maxAttempts": 3,
                    "initialBackoff": "1s",
                    "maxBackoff": "10s",
                    "backoffMultiplier": 1.1,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)
#: cmd/main.go --max-call-recv-msg-size default.
RECV_BYTES = 4 * 1024 * 1024
#: api/v1alpha1/secretsync_types.go: what a SecretSync's sourcePath (and targetKey) may be.
SOURCE_PATH = re.compile(
    r"^[A-Za-z0-9.]([-A-Za-z0-9]+([-._a-zA-Z0-9]?[A-Za-z0-9])*)?(\/([0-9]+))*$"
)

EXAMPLE = ROOT / "deploy" / "examples" / "sync-controller"


def example(name: str) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all((EXAMPLE / name).read_text()) if d]
    return doc


#: The example's class and SecretSync (deploy/examples/sync-controller/), as sent and applied.
CLASS = example("secretproviderclass.yaml")
SECRET_SYNC = example("secretsync.yaml")
SECRET_SYNC_DATA: list[dict[str, str]] = SECRET_SYNC["spec"]["secretObject"]["data"]
NAMESPACE = SECRET_SYNC["metadata"]["namespace"]
ACCOUNT = SECRET_SYNC["spec"]["serviceAccountName"]
DB = {"username": "app", "password": "s3cret-1"}


def token_request(
    key: SigningKey, namespace: str, service_account: str, audience: str, seconds: int = 600
) -> dict[str, str]:
    """A TokenRequest's status as the API server answers the controller's request: one
    audience, `seconds` long, no boundObjectRef (so no pod in the `kubernetes.io` claim)."""
    now = int(time.time())
    claims = {
        "iss": key.issuer,
        "sub": f"system:serviceaccount:{namespace}:{service_account}",
        "aud": [audience],
        "iat": now,
        "nbf": now,
        "exp": now + seconds,
        "jti": f"jti-{now}",
        "kubernetes.io": {
            "namespace": namespace,
            "serviceaccount": {"name": service_account, "uid": f"uid-{service_account}"},
        },
    }
    expires = datetime.fromtimestamp(now + seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "token": jwt.encode(claims, key.private, algorithm="RS256"),
        "expirationTimestamp": expires,
    }


def sync_request(
    parameters: dict[str, str],
    *,
    namespace: str,
    service_account: str,
    tokens: dict[str, dict[str, str]] | None,
    pod: str = CONTROLLER_POD,
    uid: str = CONTROLLER_UID,
) -> Any:
    """A MountRequest as the sync controller builds it (prepareCSIProviderParams, MountContent)."""
    attributes = dict(parameters)  # maps.Clone(spc.Spec.Parameters)
    attributes["csi.storage.k8s.io/pod.name"] = pod
    attributes["csi.storage.k8s.io/pod.uid"] = uid
    attributes["csi.storage.k8s.io/pod.namespace"] = namespace
    attributes["csi.storage.k8s.io/serviceAccount.name"] = service_account
    if tokens:  # SecretProviderServiceAccountTokenAttrs: nothing without audiences
        attributes["csi.storage.k8s.io/serviceAccount.tokens"] = json.dumps(tokens)
    return provider_pb2.MountRequest(
        attributes=json.dumps(attributes),
        secrets="{}",  # json.Marshal of an empty map
        target_path=TARGET_PATH,
        permission="420",  # json.Marshal(os.FileMode(0644))
    )


def secret_data(reply: Any, data: list[dict[str, str]]) -> dict[str, bytes]:
    """What the controller writes to the Secret (secretutil.BuildKubeSecretData, Opaque)."""
    files = {f.path: f.contents for f in reply.files}
    out = {}
    for entry in data:
        assert SOURCE_PATH.match(entry["sourcePath"]), entry  # the CRD would refuse it
        assert entry["sourcePath"] in files, f"file matching sourcePath {entry['sourcePath']}"
        out[entry["targetKey"]] = files[entry["sourcePath"]]
    return out


@dataclass
class Sync:
    bao: OpenBao
    key: SigningKey
    stub: Any
    audit: Path
    parameters: dict[str, str]

    def request(
        self,
        namespace: str = NAMESPACE,
        service_account: str = ACCOUNT,
        audiences: tuple[str, ...] = ("vault",),  # the example's --token-request-audience
        parameters: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> Any:
        tokens = {a: token_request(self.key, namespace, service_account, a) for a in audiences}
        return sync_request(
            parameters or self.parameters,
            namespace=namespace,
            service_account=service_account,
            tokens=tokens,
            **kwargs,
        )


@pytest.fixture
def sync_core() -> dict[str, Any]:
    """The provider's settings (CoreSettings fields); a test parametrizes it to change them."""
    return {}


@pytest.fixture(params=["jwt", "kubernetes"])
async def sync(
    tmp_path: Path, request: pytest.FixtureRequest, sync_core: dict[str, Any]
) -> AsyncIterator[Sync]:
    """OpenBao with a role bound to the SecretSync's service account (jwt auth: its `sub`;
    kubernetes auth, the example's: name and namespace through TokenReview), and the provider
    serving as the example's sidecar does."""
    bao = OpenBao.start(tmp_path / "openbao")
    key = SigningKey.generate()
    review = TokenReviewStub(key) if request.param == "kubernetes" else None
    try:
        parameters = dict(CLASS["spec"]["parameters"])
        parameters["vaultAddress"] = bao.addr
        bao.put_policy("team-a", read_policy(["secret/data/team-a/*"]))
        role = parameters["roleName"]
        if review is not None:  # the example's class as written: kubernetes auth, default mount
            bao.configure_kubernetes_auth("kubernetes", review.url)
            bao.add_kubernetes_role(
                "kubernetes",
                role,
                namespace=NAMESPACE,
                service_account=ACCOUNT,
                policies=["team-a"],
                audience="vault",
            )
        else:
            bao.configure_jwt_auth("jwt", key.public_pem)
            bao.add_jwt_role(
                "jwt", role, namespace=NAMESPACE, service_account=ACCOUNT, policies=["team-a"]
            )
            parameters["vaultAuthMountPath"] = "jwt"
        bao.kv2_put("secret", "team-a/db", DB)
        bao.kv2_put("secret", "team-a/api", {"key": "k-1"})
        audit = tmp_path / "audit.log"
        options = {"vault": VaultOptions(addr=bao.addr)}
        async with serving(
            tmp_path, backend_options=options, core=CoreSettings(**sync_core), audit_log=str(audit)
        ) as running:
            # The controller's own dial (pkg/provider/provider_client.go, cmd/main.go).
            channel = grpc.aio.insecure_channel(
                f"unix://{running.socket}",
                options=[
                    ("grpc.service_config", SERVICE_CONFIG),
                    ("grpc.enable_retries", 1),
                    ("grpc.max_receive_message_length", RECV_BYTES),
                ],
            )
            try:
                stub = provider_pb2_grpc.CSIDriverProviderStub(channel)
                yield Sync(bao, key, stub, audit, parameters)
            finally:
                await channel.close()
    finally:
        if review is not None:
            review.stop()
        bao.stop()


async def test_a_secretsync_is_answered_with_its_files_and_versions(sync: Sync) -> None:
    reply = await sync.stub.Mount(sync.request())  # no deadline: the controller sets none
    assert not reply.error.code
    assert {f.path: (f.mode, f.contents) for f in reply.files} == {
        "db-username": (0o644, b"app"),
        "db-password": (0o644, b"s3cret-1"),
    }
    # MountContent fails a sync whose answer has no object versions.
    versions = {v.id: v.version for v in reply.object_version}
    assert set(versions) == {"db-username", "db-password"}
    assert all(versions.values())
    assert secret_data(reply, SECRET_SYNC_DATA) == {"username": b"app", "password": b"s3cret-1"}

    # The next poll (--rotation-poll-interval): the same request, the same answer.
    again = await sync.stub.Mount(sync.request())
    assert {v.id: v.version for v in again.object_version} == versions

    # A rotation in the store: the controller's data hash changes, and so do our versions.
    sync.bao.kv2_put("secret", "team-a/db", {**DB, "password": "s3cret-2"})
    rotated = await sync.stub.Mount(sync.request())
    assert secret_data(rotated, SECRET_SYNC_DATA)["password"] == b"s3cret-2"
    changed = {v.id: v.version for v in rotated.object_version}
    assert changed["db-password"] != versions["db-password"]

    # The audit trail names the SecretSync's namespace, the class the example names in its
    # parameters, and the controller's pod (the only pod there is).
    lines = [json.loads(line) for line in sync.audit.read_text().splitlines()]
    answered = [line for line in lines if line.get("code") == "OK"]
    assert len(answered) == 3
    assert {(a["namespace"], a["class"], a["pod"], a["pod_uid"]) for a in answered} == {
        (NAMESPACE, CLASS["metadata"]["name"], CONTROLLER_POD, CONTROLLER_UID)
    }


@pytest.mark.parametrize(
    "sync_core", [{"cache_scope": "serviceaccount"}, {"cache_scope": "pod"}], ids=["sa", "pod"]
)
async def test_one_controller_pod_uid_does_not_join_two_secretsyncs_identities(
    sync: Sync,
) -> None:
    """Every SecretSync arrives with the controller's pod name and uid: the identity (and so
    every cache) must still be the SecretSync's namespace and service account."""
    await sync.stub.Mount(sync.request())  # team-a/reader: logged in and cached
    for namespace, account in [("team-b", ACCOUNT), (NAMESPACE, "other")]:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await sync.stub.Mount(sync.request(namespace=namespace, service_account=account))
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value.details()
        assert f"{namespace}/{account}" in refused.value.details()


async def test_without_the_controllers_downward_api_env_the_sync_is_still_served(
    sync: Sync,
) -> None:
    """SYNC_CONTROLLER_POD_NAME/_UID unset (a hand-written Deployment): empty pod name and uid."""
    reply = await sync.stub.Mount(sync.request(pod="", uid=""))
    assert secret_data(reply, SECRET_SYNC_DATA) == {"username": b"app", "password": b"s3cret-1"}


async def test_a_controller_without_the_classes_audience_gets_a_message_naming_it(
    sync: Sync,
) -> None:
    """--token-request-audience unset (no tokens key at all), or set to another audience."""
    for audiences in [(), ("api://other",)]:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await sync.stub.Mount(sync.request(audiences=audiences))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = refused.value.details()
        assert "no service account token for audience 'vault'" in details, details
        assert ("'api://other'" if audiences else "none") in details, details


async def test_a_token_of_another_service_account_is_refused_by_the_store(sync: Sync) -> None:
    """A token for the right audience but another service account than the SecretSync's (the
    role binds team-a/reader): the store's denial, never an answer."""
    request = sync.request()
    attributes = json.loads(request.attributes)
    other = {"vault": token_request(sync.key, NAMESPACE, "intruder", "vault")}
    attributes["csi.storage.k8s.io/serviceAccount.tokens"] = json.dumps(other)
    request.attributes = json.dumps(attributes)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await sync.stub.Mount(request)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value.details()


async def test_nested_paths_are_served_as_for_a_pod(sync: Sync) -> None:
    """A class shared with pods may name nested files: they are answered as they are (the
    provider cannot know which files a SecretSync selects); only top-level names, or names
    ending in /<digits>, can be a SecretSync's sourcePath."""
    parameters = dict(sync.parameters)
    parameters["objects"] = yaml.safe_dump(
        [
            {
                "objectName": "db/password",
                "secretPath": "secret/data/team-a/db",
                "secretKey": "password",
            },
            {"objectName": "api-key", "secretPath": "secret/data/team-a/api", "secretKey": "key"},
        ]
    )
    reply = await sync.stub.Mount(sync.request(parameters=parameters))
    assert sorted(f.path for f in reply.files) == ["api-key", "db/password"]
    assert not SOURCE_PATH.match("db/password")
    assert SOURCE_PATH.match("api-key") and SOURCE_PATH.match("cert/0")
    assert secret_data(reply, [{"sourcePath": "api-key", "targetKey": "key"}]) == {"key": b"k-1"}


def test_the_example_wires_the_controller_to_secrets_bridge_as_this_file_does() -> None:
    """deploy/examples/sync-controller/ renders, its built-in kinds validate, and its parts agree:
    the socket the controller dials, the audience it mints, the class and the SecretSync."""
    rendered = render(EXAMPLE)
    version = kubernetes_validate.latest_version()
    for doc in rendered.docs:
        if doc["kind"] not in ("SecretProviderClass", "SecretSync"):
            kubernetes_validate.validate(doc, version, strict=True)
    (deployment,) = rendered.all("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (manager,) = pod["containers"]
    (provider,) = pod["initContainers"]
    assert provider["restartPolicy"] == "Always"  # a native sidecar, ready before the manager
    flags = dict(a.removeprefix("--").split("=", 1) for a in manager["args"] if "=" in a)
    socket = f"{flags['provider-volume']}/{CLASS['spec']['provider']}.sock"
    assert f"--socket={socket}" in provider["args"]
    assert provider["args"][0] == "serve"
    shared = {m["name"] for m in manager["volumeMounts"]} & {
        m["name"] for m in provider["volumeMounts"]
    }
    (volume,) = [v for v in pod["volumes"] if v["name"] in shared]
    assert "emptyDir" in volume
    # The socket is 0660: both containers run as the pod's one uid and gid.
    assert pod["securityContext"]["runAsUser"] == 65532 and pod["securityContext"]["runAsGroup"]
    assert not any("runAsUser" in c.get("securityContext", {}) for c in (manager, provider))
    # The provider gets no Kubernetes credentials; the controller mounts its token itself.
    assert pod["automountServiceAccountToken"] is False
    assert not [m for m in provider["volumeMounts"] if "serviceaccount" in m["mountPath"]]
    # The class's audience (secrets-bridge's Vault default) is one the controller mints.
    audience = CLASS["spec"]["parameters"].get("audience", "vault")
    assert audience in flags["token-request-audience"].split(",")
    # The SecretSync names the class in its own namespace, a service account that exists there,
    # and only files the class answers with, by paths its CRD accepts.
    assert SECRET_SYNC["spec"]["secretProviderClassName"] == CLASS["metadata"]["name"]
    assert CLASS["metadata"]["namespace"] == NAMESPACE
    accounts = {
        (d["metadata"]["namespace"], d["metadata"]["name"]) for d in rendered.all("ServiceAccount")
    }
    assert (NAMESPACE, ACCOUNT) in accounts
    names = {o["objectName"] for o in yaml.safe_load(CLASS["spec"]["parameters"]["objects"])}
    for entry in SECRET_SYNC_DATA:
        assert entry["sourcePath"] in names and SOURCE_PATH.match(entry["sourcePath"])
        assert SOURCE_PATH.match(entry["targetKey"])
