"""Issue 40, items 5 and 9, against the served provider as the driver calls it (gRPC Mount on
its Unix socket), with a real OpenBao and PostgreSQL: `renewAt: "1e-9"` on a day certificate is
one issuance in ten polls (the floor), and a 300 s database lease under a login token of 20 s
renewable to 40 s, polled every 11 s, is live and logs in at every poll, replaced at the first
poll past two thirds of its token's life (33 s) instead of dying with the token at 40 s."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from backends.vault.options import Options as VaultOptions
from devkit.openbao import OpenBao
from devkit.postgres import PostgreSQL
from devkit.serving import serving
from devkit.testing import driver_request
from devkit.tokens import SigningKey

POLICY = """
path "database/creds/*" { capabilities = ["read"] }
path "pki/issue/*" { capabilities = ["update"] }
path "sys/leases/revoke" { capabilities = ["update"] }
"""
CERT = """
- objectName: tls
  secretPath: pki/issue/day
  method: POST
  secretArgs: {common_name: app.example.test}
"""
CREDS = "- {objectName: creds, secretPath: database/creds/long}"


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgreSQL]:
    server = PostgreSQL.start(tmp_path_factory.mktemp("postgres-e2e"))
    yield server
    server.stop()


class Rig:
    def __init__(self, bao: OpenBao, tokens: SigningKey, stub: Any) -> None:
        self.bao, self.tokens, self.stub = bao, tokens, stub

    async def poll(self, objects: str, **params: str) -> dict[str, Any]:
        request = driver_request(
            {
                "backend": "vault",
                "roleName": "e2e",
                "vaultAuthMountPath": "jwt",
                "objects": objects,
                **params,
            },
            tokens={"vault": self.tokens.pod_token("e2e", "app", "vault")},
            namespace="e2e",
            pod="p0",
        )
        response = await self.stub.Mount(request, timeout=30)
        (file,) = response.files
        answer: dict[str, Any] = json.loads(file.contents)
        return answer


@pytest.fixture
async def rig(tmp_path: Path, postgres: PostgreSQL) -> AsyncIterator[Rig]:
    bao = OpenBao.start(tmp_path / "openbao")
    tokens = SigningKey.generate()
    try:
        bao.configure_jwt_auth("jwt", tokens.public_pem)
        bao.put_policy("e2e", POLICY)
        bao.root().write(
            "auth/jwt/role/e2e",
            role_type="jwt",
            bound_audiences=["vault"],
            user_claim="sub",
            bound_subject="system:serviceaccount:e2e:app",
            token_policies=["e2e"],
            token_ttl="20s",
            token_max_ttl="40s",
        )
        bao.configure_database("database", postgres)
        bao.add_database_role("database", "long", default_ttl="300s", max_ttl="600s")
        bao.configure_pki("pki")
        bao.add_pki_role("pki", "day", ttl="24h", max_ttl="24h")
        options = {"vault": VaultOptions(addr=bao.addr)}
        async with serving(tmp_path, backend_options=options) as running:
            yield Rig(bao, tokens, running.stub)
    finally:
        bao.stop()


async def test_renew_at_cannot_make_every_poll_an_issuance(rig: Rig) -> None:
    rig.bao.audit_mark()
    answers = [await rig.poll(CERT, renewAt="1e-9") for _ in range(10)]
    issued = sum(n for (_op, p), n in rig.bao.audit_counts().items() if p == "pki/issue/day")
    assert issued == 1
    assert all(a == answers[0] for a in answers)


@pytest.mark.timeout(120)
async def test_a_credential_outlives_every_11s_poll_of_a_20s_40s_token(
    rig: Rig, postgres: PostgreSQL
) -> None:
    changes: list[float] = []
    user = ""
    start = time.monotonic()
    for i in range(5):  # 0, 11, 22, 33, 44 s
        await asyncio.sleep(max(0.0, start + 11.0 * i - time.monotonic()))
        answer = await rig.poll(CREDS)
        at = time.monotonic() - start
        live = await asyncio.to_thread(rig.bao.lease_lookup, answer["lease_id"])
        assert live is not None, f"a revoked lease answered at {at:.1f}s"
        data = answer["data"]
        assert await asyncio.to_thread(postgres.can_login, data["username"], data["password"])
        if data["username"] != user:
            user = data["username"]
            changes.append(at)
    assert len(changes) == 2 and 32.0 <= changes[1] <= 35.0, changes
