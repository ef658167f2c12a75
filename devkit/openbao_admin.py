"""The admin steps the harness takes on its OpenBao (as the root token, through hvac).

Mounting auth methods and engines, policies, jwt and kubernetes roles, KV writes — each step is
idempotent where OpenBao allows it, and takes `vault_namespace` for OpenBao namespaces ("" is the
root namespace). hvac is synchronous: tests call it directly; async callers (the demo, the
bench rigs) call it before or beside their own traffic, never through a proxy on their loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import hvac

from devkit import certs

ROOT_TOKEN = "root"


def read_policy(paths: Sequence[str]) -> str:
    """HCL granting read on each of `paths`."""
    return "\n".join(f'path "{p}" {{ capabilities = ["read"] }}' for p in paths)


class Admin:
    """Admin steps against the server at `addr` (mixed into `devkit.openbao.OpenBao`)."""

    addr: str

    def root(self, vault_namespace: str = "") -> Any:
        """An hvac client with the root token."""
        return hvac.Client(
            url=self.addr, token=ROOT_TOKEN, timeout=10, namespace=vault_namespace or None
        )

    def seal(self) -> None:
        self.root().sys.seal()

    def create_namespace(self, name: str) -> None:
        listed = self.root().list("sys/namespaces") or {}
        if f"{name}/" not in listed.get("data", {}).get("keys", []):
            self.root().write(f"sys/namespaces/{name}")

    def enable_auth(self, method: str, mount: str, vault_namespace: str = "") -> None:
        client = self.root(vault_namespace)
        if f"{mount}/" not in client.sys.list_auth_methods()["data"]:
            client.sys.enable_auth_method(method, path=mount)

    def enable_kv(self, mount: str, version: int, vault_namespace: str = "") -> None:
        client = self.root(vault_namespace)
        if f"{mount}/" not in client.sys.list_mounted_secrets_engines()["data"]:
            client.sys.enable_secrets_engine("kv", path=mount, options={"version": str(version)})

    def enable_engine(self, engine: str, mount: str, vault_namespace: str = "") -> None:
        client = self.root(vault_namespace)
        if f"{mount}/" not in client.sys.list_mounted_secrets_engines()["data"]:
            client.sys.enable_secrets_engine(engine, path=mount)

    def put_policy(self, name: str, hcl: str, vault_namespace: str = "") -> None:
        self.root(vault_namespace).sys.create_or_update_policy(name, hcl)

    def configure_jwt_auth(self, mount: str, public_pem: str, vault_namespace: str = "") -> None:
        """jwt auth at `mount`, validating tokens signed by the key of `public_pem`."""
        self.enable_auth("jwt", mount, vault_namespace)
        self.root(vault_namespace).write(
            f"auth/{mount}/config", jwt_validation_pubkeys=[public_pem]
        )

    def add_jwt_role(
        self,
        mount: str,
        role: str,
        *,
        namespace: str,
        service_account: str | Sequence[str],
        policies: list[str],
        audience: str = "vault",
        ttl: str = "1h",
        vault_namespace: str = "",
    ) -> None:
        """A jwt role for pods of one service account (bound `sub`) or of several (a bound
        `sub` claim listing each), accepting one audience."""
        if isinstance(service_account, str):
            binding: dict[str, Any] = {
                "bound_subject": f"system:serviceaccount:{namespace}:{service_account}"
            }
        else:
            subjects = [f"system:serviceaccount:{namespace}:{sa}" for sa in service_account]
            binding = {"bound_claims": {"sub": subjects}}
        self.root(vault_namespace).write(
            f"auth/{mount}/role/{role}",
            role_type="jwt",
            bound_audiences=[audience],
            user_claim="sub",
            token_policies=policies,
            token_ttl=ttl,
            **binding,
        )

    def configure_kubernetes_auth(
        self, mount: str, kubernetes_host: str, vault_namespace: str = ""
    ) -> None:
        self.enable_auth("kubernetes", mount, vault_namespace)
        # No reviewer JWT: OpenBao then reviews each login token with that token itself. The CA
        # is required by the API but unused over plain http to the stub.
        self.root(vault_namespace).write(
            f"auth/{mount}/config",
            kubernetes_host=kubernetes_host,
            kubernetes_ca_cert=certs.issue("kubernetes", ca=True).pem.decode(),
            disable_local_ca_jwt=True,
        )

    def add_kubernetes_role(
        self,
        mount: str,
        role: str,
        *,
        namespace: str,
        service_account: str,
        policies: list[str],
        audience: str | None = None,
        ttl: str = "1h",
        vault_namespace: str = "",
    ) -> None:
        params: dict[str, Any] = {
            "bound_service_account_names": [service_account],
            "bound_service_account_namespaces": [namespace],
            "token_policies": policies,
            "token_ttl": ttl,
        }
        if audience:
            params["audience"] = audience
        self.root(vault_namespace).write(f"auth/{mount}/role/{role}", **params)

    def kv1_put(
        self, mount: str, path: str, data: dict[str, Any], vault_namespace: str = ""
    ) -> None:
        self.root(vault_namespace).secrets.kv.v1.create_or_update_secret(
            path, data, mount_point=mount
        )

    def kv2_put(
        self, mount: str, path: str, data: dict[str, Any], vault_namespace: str = ""
    ) -> int:
        """Write a new version; returns its number."""
        result = self.root(vault_namespace).secrets.kv.v2.create_or_update_secret(
            path, data, mount_point=mount
        )
        version: int = result["data"]["version"]
        return version
