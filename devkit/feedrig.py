"""The change feed end to end, on this machine: a real OpenBao whose `socket` audit device dials
the audit Service, that Service (`ServiceProxy`: it forwards each connection to whatever the
EndpointSlice names, as kube-proxy does), watcher replicas (`secrets-bridge watch`, in this
process), the API-server fake (devkit/kubeapi.py) holding the Lease, the EndpointSlice and the
feed's ConfigMaps, and the provider (`serve --change-feed`) reading OpenBao as pods.

Used by tests/e2e/test_e2e_change_feed.py and devkit/probes/freshness.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from backends.vault.options import Options as VaultOptions
from devkit.kubeapi import KubeApi
from devkit.openbao import OpenBao, read_policy
from devkit.ports import free_port
from devkit.serving import Serving, serving
from devkit.testing import driver_request
from devkit.tokens import SigningKey
from provider.core.settings import CoreSettings
from provider.watch.run import AUDIT_SERVICE, SourceSpec, WatchSettings, watch

NAMESPACE = "secrets-bridge"


class ServiceProxy:
    """A Service without a selector: each connection goes to the address and port its
    EndpointSlice names at that moment; none while it names none."""

    def __init__(self, kube: KubeApi, namespace: str, service: str) -> None:
        self._kube, self._namespace, self._service = kube, namespace, service
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    def target(self) -> tuple[str, int] | None:
        found = self._kube.object(
            f"/apis/discovery.k8s.io/v1/namespaces/{self._namespace}/endpointslices", self._service
        )
        if not found or not found.get("endpoints"):
            return None
        return found["endpoints"][0]["addresses"][0], found["ports"][0]["port"]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        target = self.target()
        if target is None:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(_pipe(source, sink))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._pipes):
            task.cancel()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (OSError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


@dataclass
class Replica:
    settings: WatchSettings
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[int] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(watch(self.settings, stop=self.stop))

    async def halt(self) -> None:
        """A graceful stop (SIGTERM): the Lease is released."""
        self.stop.set()
        if self.task is not None:
            await asyncio.wait_for(self.task, 15)


@dataclass
class FeedRig:
    kube: KubeApi
    bao: OpenBao
    service: ServiceProxy
    replicas: list[Replica]
    provider: Serving
    tokens: SigningKey
    paths: list[str]

    def request(self, pod: str = "p0", service_account: str = "app") -> Any:
        objects = [
            {"objectName": f"o{i}", "secretPath": f"secret/data/feed/{p}", "secretKey": "pw"}
            for i, p in enumerate(self.paths)
        ]
        params = {
            "backend": "vault",
            "roleName": "feed",
            "vaultAuthMountPath": "jwt",
            "objects": yaml.safe_dump(objects),
        }
        token = self.tokens.pod_token("feed", service_account, "vault")
        return driver_request(
            params,
            tokens={"vault": token},
            namespace="feed",
            service_account=service_account,
            pod=pod,
            spc="feed",
        )

    def leader(self) -> Replica | None:
        lease = self.kube.object(
            f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases", "secrets-bridge-watch"
        )
        holder = (lease or {}).get("spec", {}).get("holderIdentity")
        return next((r for r in self.replicas if r.settings.identity == holder), None)


@contextlib.asynccontextmanager
async def feed_rig(
    work: Path,
    *,
    paths: int = 3,
    replicas: int = 2,
    heartbeat: float = 1.0,
    stale_after: float = 4.0,
    cache_ttl: float = 0.0,
    feed_window: float = 3600.0,
    change_feed: bool = True,
) -> AsyncIterator[FeedRig]:
    kube = await KubeApi(bookmark_interval=5.0).start()
    token_file = work / "kube-token"
    token_file.write_text(kube.token)
    service = ServiceProxy(kube, NAMESPACE, AUDIT_SERVICE)
    await service.start()
    bao = OpenBao.start(work / "openbao", socket_audit=f"127.0.0.1:{service.port}")
    tokens = SigningKey.generate()
    names = [f"s{i}" for i in range(paths)]
    started: list[Replica] = []
    try:
        bao.configure_jwt_auth("jwt", tokens.public_pem)
        bao.put_policy("feed", read_policy(["secret/data/feed/*"]))
        bao.add_jwt_role(
            "jwt", "feed", namespace="feed", service_account=["app", "app2"], policies=["feed"]
        )
        for name in names:
            bao.kv2_put("secret", f"feed/{name}", {"pw": f"{name}-v0"})
        for i in range(replicas):
            port = free_port()
            settings = WatchSettings(
                namespace=NAMESPACE,
                identity=f"watch-{i}",
                sources=(
                    SourceSpec(
                        "vault", {"listen": f"127.0.0.1:{port}", "addresses": [bao.addr]}, port
                    ),
                ),
                heartbeat=heartbeat,
                metrics_address=f"127.0.0.1:{free_port()}",
                kube_api_url=kube.url,
                kube_api_token_file=str(token_file),
                lease_duration=3.0,
                renew_deadline=2.0,
                retry_period=0.5,
                pod_ip="127.0.0.1",
            )
            replica = Replica(settings)
            replica.start()
            started.append(replica)
        core = CoreSettings(
            cache_ttl=cache_ttl,
            change_feed=change_feed,
            feed_window=feed_window,
            feed_stale_after=stale_after,
            feed_namespace=NAMESPACE,
            kube_api_url=kube.url,
            kube_api_token_file=str(token_file),
        )
        options = {"vault": VaultOptions(addr=bao.addr)}
        (work / "provider").mkdir(exist_ok=True)
        async with serving(work / "provider", backend_options=options, core=core) as provider:
            yield FeedRig(kube, bao, service, started, provider, tokens, names)
    finally:
        for replica in started:
            if replica.task is not None and not replica.task.done():
                await replica.halt()
        await service.stop()
        bao.stop()
        await kube.close()
