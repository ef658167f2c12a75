"""A token is used only for the pod it was issued to (issue 40, item 7), through the served
provider's gRPC Mount against a real OpenBao with jwt auth.

With a CSIDriver that requests no tokens, the driver passes a class parameter named
`csi.storage.k8s.io/serviceAccount.tokens` through unchanged (the kubelet overlays only the keys
it sets), and the nodePublishSecretRef Secret may carry the same key. Namespace team-b plants
team-a's valid token there: before the check, team-b's pods logged in with team-a's role and read
team-a's password, and the Vault token was cached under team-b's identity key, so team-b's pod with
its own token then got team-a's secret too."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from backends.vault.options import Options as VaultOptions
from devkit.openbao import OpenBao, read_policy
from devkit.serving import serving
from devkit.testing import driver_request
from devkit.tokens import SigningKey
from provider.core.settings import CoreSettings

TOKENS = "csi.storage.k8s.io/serviceAccount.tokens"
EXPIRY = "2030-01-01T00:00:00Z"


@dataclass
class Rig:
    bao: OpenBao
    key: SigningKey
    stub: Any

    def token(self, namespace: str, pod: str | None) -> str:
        return self.key.pod_token(namespace, "app", "vault", pod=pod)

    async def mount(
        self,
        role: str,
        *,
        kubelet: str | None = None,
        planted: str | None = None,
        secret: str | None = None,
        pod: str = "web-b",
    ) -> Any:
        """team-b's pod `pod` mounting a class with `role`; `kubelet`: the token the kubelet
        sent; `planted`: one the class passes as a parameter; `secret`: one in its
        nodePublishSecretRef Secret."""
        params = {
            "backend": "vault",
            "roleName": role,
            "vaultAuthMountPath": "jwt",
            "objects": yaml.safe_dump(
                [{"objectName": "pw", "secretPath": f"secret/data/{role}/db", "secretKey": "pw"}]
            ),
        }
        if planted is not None:
            params[TOKENS] = tokens_json(planted)
        request = driver_request(
            params,
            tokens={"vault": kubelet} if kubelet else None,
            namespace="team-b",
            service_account="app",
            pod=pod,
            secrets=json.dumps({TOKENS: tokens_json(secret)}) if secret else "null",
        )
        return await self.stub.Mount(request, timeout=15)


def tokens_json(token: str) -> str:
    return json.dumps({"vault": {"token": token, "expirationTimestamp": EXPIRY}})


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    bao = OpenBao.start(tmp_path / "openbao")
    key = SigningKey.generate()
    bao.configure_jwt_auth("jwt", key.public_pem)
    for team in ("team-a", "team-b"):
        bao.put_policy(team, read_policy([f"secret/data/{team}/*"]))
        bao.add_jwt_role("jwt", team, namespace=team, service_account=["app"], policies=[team])
        bao.kv2_put("secret", f"{team}/db", {"pw": f"{team}-password"})
    options = {"vault": VaultOptions(addr=bao.addr)}
    try:
        async with serving(tmp_path, backend_options=options, core=CoreSettings()) as running:
            yield Rig(bao, key, running.stub)
    finally:
        bao.stop()


def password(reply: Any) -> bytes:
    return {f.path: f.contents for f in reply.files}["pw"]


async def refused(rig: Rig, role: str, **kw: Any) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await rig.mount(role, **kw)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    return caught.value.details() or ""


async def test_a_class_passing_another_namespaces_token_is_refused_naming_the_mismatch(
    rig: Rig,
) -> None:
    stolen = rig.token("team-a", "web-a")
    rig.bao.audit_mark()
    details = await refused(rig, "team-a", planted=stolen)
    assert "kubernetes.io.namespace 'team-a'" in details
    assert "csi.storage.k8s.io/pod.namespace 'team-b'" in details
    assert stolen not in details and stolen.split(".")[1] not in details
    # Refused before any login: OpenBao saw no request at all.
    assert not rig.bao.audit_counts()
    # team-b's pod with its own token, in the same class: the store refuses it (team-a's role
    # is not bound to team-b), as nothing of the attempt was cached under team-b's key.
    own = rig.token("team-b", "web-b")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await rig.mount("team-a", kubelet=own)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "team-a-password" not in (caught.value.details() or "")
    # And with its own role, its own secret.
    assert password(await rig.mount("team-b", kubelet=own)) == b"team-b-password"


async def test_the_nodepublishsecretref_path_is_refused_too(rig: Rig) -> None:
    details = await refused(rig, "team-a", secret=rig.token("team-a", None))
    assert details.startswith(f"secrets: {TOKENS}: the token for audience 'vault'")
    assert "kubernetes.io.namespace 'team-a'" in details


async def test_a_token_of_another_pod_of_the_same_account_is_refused(rig: Rig) -> None:
    details = await refused(rig, "team-b", planted=rig.token("team-b", "web-b2"))
    assert "kubernetes.io.pod.name 'web-b2'" in details
    assert "csi.storage.k8s.io/pod.name 'web-b'" in details


async def test_a_passed_token_whose_claims_match_the_pod_is_used(rig: Rig) -> None:
    # A CSIDriver without tokenRequests and a token that is the pod's own: served.
    reply = await rig.mount("team-b", planted=rig.token("team-b", "web-b"))
    assert password(reply) == b"team-b-password"
    # One bound to no pod (kubectl create token; the sync controller's) names only its account.
    reply = await rig.mount("team-b", secret=rig.token("team-b", None), pod="web-b3")
    assert password(reply) == b"team-b-password"
