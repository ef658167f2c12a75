"""Fixtures: one real OpenBao dev server per session, configured like a small cluster's Vault.

jwt/         jwt auth, validating tokens signed by `signing_key`
kubernetes/  kubernetes auth, reviewing tokens through a TokenReview stub
secret/      KV v2 (the dev server's own)        kv1/  KV v1
roles:       app (default/app), other (team/other): each may read its own paths only
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from backends.vault.dialect import parse
from backends.vault.options import Options
from backends.vault.store import VaultBackend, create
from devkit.kube import TokenReviewStub
from devkit.openbao import OpenBao
from devkit.testing import make_env
from devkit.tokens import SigningKey
from provider.core.model import ParseContext, StorePlan

APP_POLICY = """
path "secret/data/app/*" { capabilities = ["read"] }
path "secret/app/*" { capabilities = ["read"] }
path "kv1/app/*" { capabilities = ["read"] }
path "sys/tools/hash/*" { capabilities = ["update"] }
"""
OTHER_POLICY = """
path "secret/data/other/*" { capabilities = ["read"] }
"""


@pytest.fixture(scope="session")
def signing_key() -> SigningKey:
    return SigningKey.generate()


@pytest.fixture(scope="session")
def token_review(signing_key: SigningKey) -> Iterator[TokenReviewStub]:
    stub = TokenReviewStub(signing_key)
    yield stub
    stub.stop()


@pytest.fixture(scope="session")
def openbao(
    tmp_path_factory: pytest.TempPathFactory,
    signing_key: SigningKey,
    token_review: TokenReviewStub,
) -> Iterator[OpenBao]:
    server = OpenBao.start(Path(tmp_path_factory.mktemp("openbao")), tls=True)
    try:
        server.put_policy("app", APP_POLICY)
        server.put_policy("other", OTHER_POLICY)
        server.configure_jwt_auth("jwt", signing_key.public_pem)
        server.add_jwt_role(
            "jwt", "app", namespace="default", service_account="app", policies=["app"]
        )
        server.add_jwt_role(
            "jwt", "other", namespace="team", service_account="other", policies=["other"]
        )
        server.configure_kubernetes_auth("kubernetes", token_review.url)
        server.add_kubernetes_role(
            "kubernetes", "app", namespace="default", service_account="app", policies=["app"]
        )
        server.enable_kv("kv1", 1)
        # An OpenBao namespace with its own jwt auth, KV and role of the same name.
        server.create_namespace("team")
        server.put_policy("app", APP_POLICY, vault_namespace="team")
        server.configure_jwt_auth("jwt", signing_key.public_pem, vault_namespace="team")
        server.add_jwt_role(
            "jwt",
            "app",
            namespace="default",
            service_account="app",
            policies=["app"],
            vault_namespace="team",
        )
        server.enable_kv("secret", 2, vault_namespace="team")
        yield server
    finally:
        server.stop()


@pytest.fixture
async def backend(openbao: OpenBao) -> AsyncIterator[VaultBackend]:
    vault = create(make_env("vault", Options(addr=openbao.addr)))
    yield vault
    await vault.close()


def plan_for(objects: str, **params: str) -> StorePlan:
    """A parsed class with `objects` (YAML text) and top-level parameters."""
    return parse({"objects": objects, **params}, ParseContext(options=Options()))
