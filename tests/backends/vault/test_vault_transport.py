"""TLS settings and namespaces against the real OpenBao: CA file and directory, server name,
client certificates, skip-verify, X-Vault-Namespace."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from backends.vault.store import VaultBackend
from devkit.openbao import TLS_SERVER_NAME, OpenBao
from devkit.testing import fetch_ctx, make_pod
from devkit.tokens import SigningKey
from provider.core.errors import BridgeError, NotFound, StoreUnavailable
from provider.core.model import SecretValue, StorePlan
from tests.backends.vault.conftest import plan_for

OBJECT = "- {objectName: s, secretPath: secret/data/app/tls, secretKey: k}"


@pytest.fixture(autouse=True)
def _secret(openbao: OpenBao) -> None:
    openbao.kv2_put("secret", "app/tls", {"k": "over-tls"})


async def fetch_one(backend: VaultBackend, plan: StorePlan, key: SigningKey) -> object:
    pod = make_pod(tokens={"vault": key.pod_token("default", "app")})
    identity = await backend.identify(plan, pod)
    ref = plan.objects[0].ref
    return (await backend.fetch(plan, identity, [ref], fetch_ctx(10)))[ref]


def tls_class(address: str, **params: str) -> StorePlan:
    return plan_for(
        OBJECT, vaultAddress=address, roleName="app", vaultAuthMountPath="jwt", **params
    )


def served(fetched: object) -> SecretValue:
    assert isinstance(fetched, list), fetched
    return fetched[0]  # type: ignore[no-any-return]


async def test_ca_file_and_server_name(
    openbao: OpenBao, signing_key: SigningKey, backend: VaultBackend
) -> None:
    plan = tls_class(
        openbao.tls_addr, vaultCACertPath=str(openbao.ca_file), vaultTLSServerName=TLS_SERVER_NAME
    )
    assert served(await fetch_one(backend, plan, signing_key)).view() == {"k": "over-tls"}


async def test_ca_directory(
    openbao: OpenBao, signing_key: SigningKey, backend: VaultBackend, tmp_path: Path
) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail(
            "openssl is needed to name a CA directory's hashed links (apt-get install openssl)"
        )
    assert openbao.ca_file is not None
    subject_hash = subprocess.run(
        [openssl, "x509", "-hash", "-noout", "-in", str(openbao.ca_file)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    shutil.copy(openbao.ca_file, tmp_path / f"{subject_hash}.0")
    plan = tls_class(
        openbao.tls_addr, vaultCADirectory=str(tmp_path), vaultTLSServerName=TLS_SERVER_NAME
    )
    assert served(await fetch_one(backend, plan, signing_key)).view() == {"k": "over-tls"}


async def test_skip_verify(
    openbao: OpenBao, signing_key: SigningKey, backend: VaultBackend
) -> None:
    plan = tls_class(openbao.tls_addr, vaultSkipTLSVerify="true")
    assert served(await fetch_one(backend, plan, signing_key)).view() == {"k": "over-tls"}


@pytest.mark.parametrize(
    "params",
    [
        {},  # the system CAs do not know the test CA
        {"ca": True},  # the certificate does not name 127.0.0.1
    ],
    ids=["unknown-ca", "wrong-name"],
)
async def test_tls_failures_are_clear_and_not_retried(
    openbao: OpenBao, signing_key: SigningKey, backend: VaultBackend, params: dict[str, bool]
) -> None:
    extra = {"vaultCACertPath": str(openbao.ca_file)} if params.get("ca") else {}
    plan = tls_class(openbao.tls_addr, **extra)
    with pytest.raises(StoreUnavailable) as info:
        await fetch_one(backend, plan, signing_key)
    assert not info.value.transient
    assert "vaultCACertPath" in str(info.value) and "vaultTLSServerName" in str(info.value)


async def test_client_certificate(
    openbao: OpenBao, signing_key: SigningKey, backend: VaultBackend
) -> None:
    base = {"vaultCACertPath": str(openbao.ca_file), "vaultTLSServerName": TLS_SERVER_NAME}
    without = tls_class(openbao.mtls_addr, **base)
    with pytest.raises(StoreUnavailable, match="client certificate settings") as info:
        await fetch_one(backend, without, signing_key)
    assert not info.value.transient
    plan = tls_class(
        openbao.mtls_addr,
        **base,
        vaultTLSClientCertPath=str(openbao.client_cert_file),
        vaultTLSClientKeyPath=str(openbao.client_key_file),
    )
    assert served(await fetch_one(backend, plan, signing_key)).view() == {"k": "over-tls"}


async def test_missing_tls_files_name_the_parameters(
    openbao: OpenBao, signing_key: SigningKey, backend: VaultBackend, tmp_path: Path
) -> None:
    plan = tls_class(openbao.tls_addr, vaultCACertPath=str(tmp_path / "nope.pem"))
    with pytest.raises(BridgeError, match="vaultCACertPath"):
        await fetch_one(backend, plan, signing_key)


async def test_namespace_is_sent_on_login_and_reads(
    openbao: OpenBao, signing_key: SigningKey, backend: VaultBackend
) -> None:
    openbao.kv2_put("secret", "app/tls", {"k": "in-team"}, vault_namespace="team")
    plan = tls_class(openbao.addr, vaultNamespace="team")
    openbao.audit_mark()
    assert served(await fetch_one(backend, plan, signing_key)).view() == {"k": "in-team"}
    counts = openbao.audit_counts()
    assert counts[("update", "team/auth/jwt/login")] == 1
    assert counts[("read", "team/secret/data/app/tls")] == 1
    # The same class without the namespace is another identity reading another secret.
    root_ns = served(await fetch_one(backend, tls_class(openbao.addr), signing_key))
    assert root_ns.view() == {"k": "over-tls"}


async def test_unknown_namespace(
    openbao: OpenBao, signing_key: SigningKey, backend: VaultBackend
) -> None:
    plan = tls_class(openbao.addr, vaultNamespace="nope")
    with pytest.raises(NotFound) as info:
        await fetch_one(backend, plan, signing_key)
    assert "namespace 'nope'" in str(info.value)
    assert "check vaultNamespace" in str(info.value)
