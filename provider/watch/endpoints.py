"""The audit Service's EndpointSlice, pointed at the Lease holder: the Service has no selector
(the chart's watch-service.yaml), so Vault's socket audit device reaches only the replica that
publishes, and reaches the next one after a takeover (it dials again once a write fails)."""

from __future__ import annotations

import ipaddress
from typing import Any

from provider.core.kube import Conflict, KubeClient, endpointslices

SERVICE_LABEL = "kubernetes.io/service-name"
MANAGED_BY = "endpointslice.kubernetes.io/managed-by"


async def point_service(
    client: KubeClient, namespace: str, service: str, ip: str, port: int, *, owner: str
) -> None:
    """Make EndpointSlice `service` (of Service `service`) name `ip`:`port` alone."""
    family = "IPv6" if ipaddress.ip_address(ip).version == 6 else "IPv4"
    body: dict[str, Any] = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": service,
            "labels": {SERVICE_LABEL: service, MANAGED_BY: owner},
        },
        "addressType": family,
        "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}],
        "ports": [{"name": "audit", "port": port, "protocol": "TCP"}],
    }
    path = endpointslices(namespace, service)
    for _attempt in range(4):
        current = await client.get(path)
        try:
            if current is None:
                await client.create(endpointslices(namespace), body)
            else:
                body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                await client.replace(path, body)
            return
        except Conflict:
            continue
    raise Conflict(f"EndpointSlice {service} changed under each write")
