"""The admin steps the harness takes on its OpenBao (as the root token, through hvac).

Mounting auth methods and engines, policies, jwt and kubernetes roles, KV writes, the dynamic
engines (database against a real PostgreSQL, `devkit.postgres`; PKI with an internal root) —
each step is idempotent where OpenBao allows it, and takes `vault_namespace` for OpenBao
namespaces ("" is the root namespace). hvac is synchronous: tests call it directly; async
callers (the demo, the bench rigs) call it before or beside their own traffic, never through a
proxy on their loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import hvac
import hvac.exceptions

from devkit import certs

ROOT_TOKEN = "root"

#: OpenBao's built-in PostgreSQL plugin (`sys/plugins/catalog`, type database).
POSTGRES_PLUGIN = "postgresql-database-plugin"

#: A dynamic user: it logs in until its lease's expiry, and may read the public schema.
PG_CREATION_STATEMENTS = (
    """CREATE ROLE "{{name}}" WITH LOGIN PASSWORD '{{password}}' VALID UNTIL '{{expiration}}';""",
    """GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{{name}}";""",
)
#: Revoking the lease ends the user's sessions and drops it: it is gone from pg_roles.
PG_REVOCATION_STATEMENTS = (
    """SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{{name}}';""",
    """REVOKE ALL PRIVILEGES ON ALL TABLES IN SCHEMA public FROM "{{name}}";""",
    """DROP ROLE IF EXISTS "{{name}}";""",
)


class DatabaseServer(Protocol):
    """What `configure_database` needs of a database (`devkit.postgres.PostgreSQL` is one)."""

    @property
    def connection_url(self) -> str: ...

    @property
    def admin_user(self) -> str: ...

    @property
    def admin_password(self) -> str: ...


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
        self._enable_engine("kv", mount, vault_namespace, options={"version": str(version)})

    def _enable_engine(
        self, engine: str, mount: str, vault_namespace: str, options: dict[str, str] | None = None
    ) -> None:
        """The secrets engine at `mount`, unless something is mounted there already."""
        client = self.root(vault_namespace)
        if f"{mount}/" not in client.sys.list_mounted_secrets_engines()["data"]:
            client.sys.enable_secrets_engine(engine, path=mount, options=options)

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

    # -- dynamic secrets ---------------------------------------------------------------------

    def configure_database(
        self,
        mount: str,
        postgres: DatabaseServer,
        *,
        name: str = "pg",
        allowed_roles: str = "*",
        vault_namespace: str = "",
    ) -> None:
        """The database engine at `mount`, with connection `name` to `postgres` as its
        superuser; OpenBao verifies it can connect before accepting the config."""
        self._enable_engine("database", mount, vault_namespace)
        self.root(vault_namespace).write(
            f"{mount}/config/{name}",
            plugin_name=POSTGRES_PLUGIN,
            connection_url=postgres.connection_url,
            username=postgres.admin_user,
            password=postgres.admin_password,
            allowed_roles=allowed_roles,
            verify_connection=True,
        )

    def add_database_role(
        self,
        mount: str,
        role: str,
        *,
        db: str = "pg",
        default_ttl: str = "300s",
        max_ttl: str = "600s",
        vault_namespace: str = "",
    ) -> None:
        """A role whose creds (`<mount>/creds/<role>`) are a fresh PostgreSQL login user, dropped
        when its lease is revoked or expires."""
        self.root(vault_namespace).write(
            f"{mount}/roles/{role}",
            db_name=db,
            creation_statements=list(PG_CREATION_STATEMENTS),
            revocation_statements=list(PG_REVOCATION_STATEMENTS),
            default_ttl=default_ttl,
            max_ttl=max_ttl,
        )

    def configure_pki(
        self,
        mount: str,
        *,
        common_name: str = "secrets-bridge test CA",
        max_ttl: str = "87600h",
        vault_namespace: str = "",
    ) -> None:
        """The pki engine at `mount` (its max lease TTL tuned to `max_ttl`) with an internal EC
        root CA, generated once: a mount that already has an issuer keeps it."""
        self._enable_engine("pki", mount, vault_namespace)
        client = self.root(vault_namespace)
        client.sys.tune_mount_configuration(path=mount, max_lease_ttl=max_ttl)
        if client.list(f"{mount}/issuers"):  # None while the mount has no issuer
            return
        client.write(
            f"{mount}/root/generate/internal",
            common_name=common_name,
            ttl=max_ttl,
            key_type="ec",
            key_bits=256,
        )

    def add_pki_role(
        self,
        mount: str,
        role: str,
        *,
        allowed_domains: Sequence[str] = ("example.test",),
        ttl: str = "600s",
        max_ttl: str = "600s",
        vault_namespace: str = "",
    ) -> None:
        """A role issuing EC P-256 certificates (`<mount>/issue/<role>`) for the domains and
        their subdomains."""
        self.root(vault_namespace).write(
            f"{mount}/roles/{role}",
            allowed_domains=list(allowed_domains),
            allow_subdomains=True,
            allow_bare_domains=True,
            key_type="ec",
            key_bits=256,
            ttl=ttl,
            max_ttl=max_ttl,
        )

    def lease_lookup(self, lease_id: str, vault_namespace: str = "") -> dict[str, Any] | None:
        """The lease's data (`id`, `expire_time`, `ttl`, `renewable`, ...) as root, or None once
        it is revoked or expired (OpenBao answers 400 "invalid lease")."""
        try:
            reply = self.root(vault_namespace).write("sys/leases/lookup", lease_id=lease_id)
        except hvac.exceptions.InvalidRequest as err:
            if "invalid lease" in str(err):
                return None
            raise
        data: dict[str, Any] = reply["data"]
        return data

    def tune_auth(
        self, mount: str, default_ttl: str, max_ttl: str, vault_namespace: str = ""
    ) -> None:
        """The default and maximum TTL of the tokens the auth method at `mount` issues (a role's
        own token_ttl still wins below the maximum)."""
        self.root(vault_namespace).sys.tune_auth_method(
            path=mount, default_lease_ttl=default_ttl, max_lease_ttl=max_ttl
        )
