"""Held credentials against a real OpenBao and PostgreSQL (issue 40, items 5 and 9): a class's
`renewAt` cannot make every poll an issuance (the floor), replaced leases are revoked after the
grace so that they do not pile up in OpenBao, and a credential bound to a login token that
cannot be renewed past its max TTL is replaced before the token ends, whatever the pod's poll
period within the documented rule (three polls per token max TTL).

Live leases are counted with `sys/leases/lookup`; issuances in OpenBao's audit log."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit.openbao import OpenBao
from devkit.postgres import PostgreSQL
from devkit.tokens import SigningKey
from provider.core.model import Pod
from tests.backends.vault.test_vault_lifetimes import Polls as LifetimePolls

POLICY = """
path "dbfloor/creds/*" { capabilities = ["read"] }
path "pkifloor/issue/*" { capabilities = ["update"] }
path "sys/leases/revoke" { capabilities = ["update"] }
"""
#: Whole answers (no secretKey): the file holds the lease id, which the test looks up.
CERT = """
- objectName: tls
  secretPath: pkifloor/issue/{role}
  method: POST
  secretArgs: {{common_name: app.example.test}}
"""
CREDS = """
- objectName: creds
  secretPath: dbfloor/creds/{role}
"""


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgreSQL]:
    server = PostgreSQL.start(tmp_path_factory.mktemp("postgres-floor"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def engines(openbao: OpenBao, postgres: PostgreSQL) -> OpenBao:
    openbao.configure_database("dbfloor", postgres)
    # A lease that cannot be renewed past its first hour: each renewal point re-issues it.
    openbao.add_database_role("dbfloor", "hour", default_ttl="1h", max_ttl="1h")
    openbao.add_database_role("dbfloor", "long", default_ttl="300s", max_ttl="600s")
    openbao.configure_pki("pkifloor")
    openbao.add_pki_role("pkifloor", "day", ttl="24h", max_ttl="24h")
    # A role whose certificates come with a lease (revocable through sys/leases/revoke).
    openbao.root().write(
        "pkifloor/roles/leased",
        allowed_domains=["example.test"],
        allow_subdomains=True,
        key_type="ec",
        key_bits=256,
        ttl="1h",
        max_ttl="1h",
        generate_lease=True,
    )
    openbao.put_policy("floor", POLICY)
    for service_account, (ttl, max_ttl) in {
        "floor": ("1h", "2h"),
        "short-7": ("20s", "40s"),
        "short-11": ("20s", "40s"),
    }.items():
        openbao.root().write(
            f"auth/jwt/role/{service_account}",
            role_type="jwt",
            bound_audiences=["vault"],
            user_claim="sub",
            bound_subject=f"system:serviceaccount:default:{service_account}",
            token_policies=["floor"],
            token_ttl=ttl,
            token_max_ttl=max_ttl,
        )
    return openbao


class Polls(LifetimePolls):
    """test_vault_lifetimes' harness, for the `floor` service account, each poll's one file
    parsed."""

    def pod(self, uid: str = "uid-0", service_account: str = "floor") -> Pod:
        return super().pod(uid, service_account)

    async def answer(self, objects: str, pod: Pod, **params: str) -> dict[str, Any]:
        """The answer's one file, parsed: the whole answer, lease_id and data."""
        result = await self.poll(objects, pod, role=pod.service_account, **params)
        (file,) = result.files
        answer: dict[str, Any] = json.loads(file.contents)
        return answer

    def live(self, lease_ids: list[str]) -> list[str]:
        return [lease for lease in lease_ids if self.openbao.lease_lookup(lease) is not None]


def issuances(openbao: OpenBao, path: str) -> int:
    return sum(n for (_op, p), n in openbao.audit_counts().items() if p == path)


@pytest.fixture
async def polls(engines: OpenBao, signing_key: SigningKey, tmp_path: Path) -> AsyncIterator[Polls]:
    harness = Polls(engines, signing_key, tmp_path)
    yield harness
    await harness.backends.close()


async def test_renew_at_1e_9_on_a_day_certificate_is_one_issuance_in_ten_polls(
    polls: Polls,
) -> None:
    pod = polls.pod()
    polls.openbao.audit_mark()
    answers = [await polls.answer(CERT.format(role="day"), pod, renewAt="1e-9") for _ in range(10)]
    assert issuances(polls.openbao, "pkifloor/issue/day") == 1
    assert all(a == answers[0] for a in answers)


@pytest.mark.parametrize(("objects", "path"), [(CERT, "pkifloor/issue"), (CREDS, "dbfloor/creds")])
async def test_replaced_hour_leases_are_revoked_after_the_grace(
    engines: OpenBao, signing_key: SigningKey, tmp_path: Path, objects: str, path: str
) -> None:
    """Hour-long leases that cannot be renewed, re-issued every second (a class's renewAt under
    a 1 s floor): each replaced one is revoked 2 s later (the grace), so at most a few are live
    at a time and, once the grace has passed, only the one the pod holds."""
    role = "leased" if path.startswith("pki") else "hour"
    polls = Polls(
        engines, signing_key, tmp_path, min_renew_interval=1.0, replaced_credential_grace=2.0
    )
    try:
        pod = polls.pod()
        polls.openbao.audit_mark()
        issued: list[str] = []
        start = time.monotonic()
        while time.monotonic() - start < 6.0:
            lease = (await polls.answer(objects.format(role=role), pod, renewAt="1e-9"))["lease_id"]
            if not issued or issued[-1] != lease:
                issued.append(lease)
            await asyncio.sleep(0.4)
        # About one issuance or renewal a second (the floor), not one every poll (15 polls); a
        # renewal that OpenBao grants a second short of the hour may count as one.
        assert issuances(polls.openbao, f"{path}/{role}") == len(issued) >= 3
        assert len(issued) + issuances(polls.openbao, "sys/leases/renew") <= 8
        live_now = polls.live(issued)
        assert len(live_now) <= 4, f"{len(live_now)} of {len(issued)} leases live"
        await asyncio.sleep(2.5)
        assert polls.live(issued) == [issued[-1]]  # every replaced one revoked; the held one not
    finally:
        await polls.backends.close()


@pytest.mark.timeout(150)
async def test_a_credential_outlives_every_poll_under_a_20s_40s_token(
    polls: Polls, postgres: PostgreSQL
) -> None:
    """A 300 s database lease under a login token of 20 s TTL renewable to 40 s, polled every
    7 s and every 11 s (two service accounts: two tokens): at every poll the credential answered
    is live in OpenBao and logs in to PostgreSQL, and each is replaced at the first poll past
    two thirds of its token's 40 s (28 s and 33 s), never after its token ended."""
    objects = CREDS.format(role="long")

    async def pod_polling(service_account: str, period: float) -> list[tuple[float, str]]:
        pod = polls.pod(uid=service_account, service_account=service_account)
        changes: list[tuple[float, str]] = []
        start = time.monotonic()
        for i in range(int(70 // period) + 1):
            await asyncio.sleep(max(0.0, start + i * period - time.monotonic()))
            answer = await polls.answer(objects, pod)
            at = time.monotonic() - start
            user, password = answer["data"]["username"], answer["data"]["password"]
            live = await asyncio.to_thread(polls.openbao.lease_lookup, answer["lease_id"])
            assert live is not None, f"{service_account}: a revoked lease answered at {at:.1f}s"
            ok = await asyncio.to_thread(postgres.can_login, user, password)
            assert ok, f"{service_account}: a dropped user answered at {at:.1f}s"
            if not changes or changes[-1][1] != user:
                changes.append((at, user))
        return changes

    seven, eleven = await asyncio.gather(pod_polling("short-7", 7.0), pod_polling("short-11", 11.0))
    for period, changes in ((7.0, seven), (11.0, eleven)):
        issued = [at for at, _ in changes]
        gaps = [b - a for a, b in itertools.pairwise(issued)]
        print(f"period {period:g}s: credentials at {[round(t, 1) for t in issued]}")
        assert gaps, "never replaced"
        # Replaced at the first poll past 2/3 of 40 s after its issue, before its token's end.
        for gap in gaps:
            assert 40 * 2 / 3 - 0.5 <= gap <= 40 * 2 / 3 + period + 1.0, gaps
