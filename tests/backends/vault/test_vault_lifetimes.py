"""Credentials with a lifetime, end to end through the Mounter against a real OpenBao: its
database engine on a real PostgreSQL (devkit/postgres.py) and its PKI engine.

The driver re-sends a volume's Mount at every rotation poll; these tests poll the way it does
and check what the store and the database saw: one issuance across polls, renewal or re-issue
at two thirds of a credential's life and not before, no poll ever answering a credential that
OpenBao has revoked, one credential per pod, and the leases of a pod that stopped polling
revoked.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from backends.vault.options import Options
from devkit.openbao import OpenBao
from devkit.postgres import PostgreSQL
from devkit.testing import make_pod
from devkit.tokens import SigningKey
from provider.core.metrics import Metrics
from provider.core.model import Pod
from provider.core.settings import CoreSettings, ServeSettings
from provider.edge.app import build_mounter
from provider.mount.mounting import MountInput, MountResult

DYN_POLICY = """
path "database/creds/*" { capabilities = ["read"] }
path "pki/issue/*" { capabilities = ["update"] }
path "sys/leases/revoke" { capabilities = ["update"] }
"""
#: The default policy's grants only: renew, but no revoke.
NO_REVOKE_POLICY = """
path "database/creds/*" { capabilities = ["read"] }
"""

CREDS = """
- objectName: creds
  secretPath: database/creds/{role}
"""
CERT = """
- objectName: tls.crt
  secretPath: pki/issue/{role}
  method: POST
  secretArgs: {{common_name: app.example.test}}
  secretKey: certificate
- objectName: tls.key
  secretPath: pki/issue/{role}
  method: POST
  secretArgs: {{common_name: app.example.test}}
  secretKey: private_key
"""


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgreSQL]:
    server = PostgreSQL.start(tmp_path_factory.mktemp("postgres"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def engines(openbao: OpenBao, postgres: PostgreSQL) -> OpenBao:
    """database/ on the PostgreSQL, pki/, and jwt roles for default/app with short tokens."""
    openbao.configure_database("database", postgres)
    openbao.add_database_role("database", "long", default_ttl="300s", max_ttl="600s")
    openbao.add_database_role("database", "short", default_ttl="9s", max_ttl="60s")
    openbao.configure_pki("pki")
    openbao.add_pki_role("pki", "long", ttl="600s", max_ttl="600s")
    openbao.add_pki_role("pki", "short", ttl="9s", max_ttl="9s")
    openbao.put_policy("dyn", DYN_POLICY)
    openbao.put_policy("dyn-no-revoke", NO_REVOKE_POLICY)
    subject = "system:serviceaccount:default:app"
    for role, policy, ttl, max_ttl in (
        ("dyn", "dyn", "1h", "2h"),
        ("dyn-short-token", "dyn", "20s", "40s"),
        ("dyn-no-revoke", "dyn-no-revoke", "1h", "2h"),
    ):
        openbao.root().write(
            f"auth/jwt/role/{role}",
            role_type="jwt",
            bound_audiences=["vault"],
            user_claim="sub",
            bound_subject=subject,
            token_policies=[policy],
            token_ttl=ttl,
            token_max_ttl=max_ttl,
        )
    return openbao


class Polls:
    """A provider's Mounter and pods of default/app polling one class."""

    def __init__(self, openbao: OpenBao, key: SigningKey, tmp_path: Path, **core: Any) -> None:
        self.openbao = openbao
        self.key = key
        hmac_key = tmp_path / "hmac"
        hmac_key.write_bytes(b"k" * 32)
        self.metrics = Metrics()
        settings = ServeSettings(
            hmac_key_file=str(hmac_key),
            core=CoreSettings(**core),
            backend_options={"vault": Options(addr=openbao.addr)},
        )
        self.mounter, self.backends = build_mounter(settings, self.metrics)

    def pod(self, uid: str = "uid-0", service_account: str = "app") -> Pod:
        token = self.key.pod_token("default", service_account, lifetime=3600)
        return make_pod(
            "default", service_account, name=f"app-{uid}", uid=uid, tokens={"vault": token}
        )

    async def poll(self, objects: str, pod: Pod, role: str = "dyn", **params: str) -> MountResult:
        full = {
            "backend": "vault",
            "roleName": role,
            "vaultAuthMountPath": "jwt",
            "objects": objects,
            **params,
        }
        return await self.mounter.mount(MountInput(full, pod, permission=0o644), audit=True)

    def events(self) -> dict[str, float]:
        return {
            sample.labels["event"]: sample.value
            for metric in self.metrics.credential_events.collect()
            for sample in metric.samples
            if sample.name.endswith("_total")
        }


@pytest.fixture
async def polls(engines: OpenBao, signing_key: SigningKey, tmp_path: Path) -> AsyncIterator[Polls]:
    harness = Polls(engines, signing_key, tmp_path)
    yield harness
    await harness.backends.close()


def files(result: MountResult) -> dict[str, bytes]:
    return {f.path: f.contents for f in result.files}


def versions(result: MountResult) -> dict[str, str]:
    return {v.id: v.version for v in result.versions}


def credential(result: MountResult) -> dict[str, Any]:
    """The whole database answer the pod got: lease_id, data.username, data.password."""
    answer: dict[str, Any] = json.loads(files(result)["creds"])
    return answer


def sources(result: MountResult) -> set[str | None]:
    return {served.source for served in result.served}


def calls(openbao: OpenBao, path: str) -> int:
    return sum(n for (_op, p), n in openbao.audit_counts().items() if p == path)


async def test_ten_polls_are_one_issuance_with_identical_files(
    polls: Polls, postgres: PostgreSQL
) -> None:
    objects = CREDS.format(role="long") + CERT.format(role="long")
    pod = polls.pod()
    users_before = postgres.roles()
    polls.openbao.audit_mark()
    answers = [await polls.poll(objects, pod) for _ in range(10)]
    assert calls(polls.openbao, "database/creds/long") == 1
    assert calls(polls.openbao, "pki/issue/long") == 1
    assert len(postgres.roles() - users_before) == 1
    assert all(files(a) == files(answers[0]) for a in answers)
    assert all(versions(a) == versions(answers[0]) for a in answers)
    assert sources(answers[0]) == {"issued"}
    assert all(sources(a) == {"reused"} for a in answers[1:])
    assert polls.events() == {"issued": 2.0, "reused": 18.0}


async def test_a_short_lease_is_renewed_at_two_thirds_of_its_life_not_before(
    polls: Polls,
) -> None:
    objects = CREDS.format(role="short")  # 9 s leases, renewable up to 60 s
    pod = polls.pod()
    polls.openbao.audit_mark()
    first = await polls.poll(objects, pod)
    issued = time.monotonic()
    renewed_at = None
    while time.monotonic() - issued < 8.0:
        await asyncio.sleep(0.5)
        answer = await polls.poll(objects, pod)
        assert files(answer) == files(first)  # renewed: the same user, the same files
        if renewed_at is None and calls(polls.openbao, "sys/leases/renew"):
            renewed_at = time.monotonic() - issued
            assert sources(answer) == {"renewed"}  # the audit trail's source of that poll
    assert renewed_at is not None
    assert 6.0 - 0.6 <= renewed_at <= 7.0  # two thirds of 9 s, at the first poll after it
    assert calls(polls.openbao, "database/creds/short") == 1
    lease = polls.openbao.lease_lookup(credential(first)["lease_id"])
    assert lease is not None and lease["ttl"] > 5


async def test_a_short_certificate_is_reissued_with_its_key_at_two_thirds(polls: Polls) -> None:
    objects = CERT.format(role="short")  # 9 s certificates
    pod = polls.pod()
    first = files(await polls.poll(objects, pod))
    issued = time.monotonic()
    changed_at = None
    answer = first
    while changed_at is None and time.monotonic() - issued < 9.0:
        await asyncio.sleep(0.5)
        answer = files(await polls.poll(objects, pod))
        if answer != first:
            changed_at = time.monotonic() - issued
    assert changed_at is not None
    assert 6.0 - 0.6 <= changed_at <= 7.0
    # Certificate and key are replaced together, from one issuance.
    assert answer["tls.crt"] != first["tls.crt"] and answer["tls.key"] != first["tls.key"]
    assert polls.events().get("reissued") == 1.0


@pytest.mark.bench
@pytest.mark.timeout(240)
async def test_no_poll_answers_a_revoked_credential_under_a_20s_40s_token(
    polls: Polls, postgres: PostgreSQL
) -> None:
    """A 300 s lease under a login token of 20 s TTL and 40 s max TTL, polled every 3 s for
    two minutes: each answer's user is in PostgreSQL and logs in, and its lease is live."""
    objects = CREDS.format(role="long")
    pod = polls.pod()
    seen: list[str] = []
    start = time.monotonic()
    while time.monotonic() - start < 120.0:
        answer = credential(await polls.poll(objects, pod, role="dyn-short-token"))
        user, password = answer["data"]["username"], answer["data"]["password"]
        assert polls.openbao.lease_lookup(answer["lease_id"]) is not None, "lease revoked"
        assert postgres.can_login(user, password), f"user dropped at {time.monotonic() - start}"
        if not seen or seen[-1] != user:
            seen.append(user)
        await asyncio.sleep(3.0)
    # Each login token lives at most 40 s, and its leases with it: about one credential per
    # token, re-issued at a poll before the token ends.
    print(f"credentials issued in 120 s: {len(seen)}")
    assert 3 <= len(seen) <= 6
    events = polls.events()
    assert events.get("renewed", 0) >= 2  # the token was renewed (renew-self) between


@pytest.mark.parametrize("cache_ttl", [0.0, 30.0])
async def test_two_pods_of_one_service_account_get_separate_credentials(
    engines: OpenBao, signing_key: SigningKey, tmp_path: Path, cache_ttl: float
) -> None:
    polls = Polls(engines, signing_key, tmp_path, cache_ttl=cache_ttl)
    try:
        objects = CREDS.format(role="long") + CERT.format(role="long")
        a, b = polls.pod("uid-a"), polls.pod("uid-b")
        # Together, the first time: one shared read, and the second pod reads its own.
        first_a, first_b = await asyncio.gather(polls.poll(objects, a), polls.poll(objects, b))
        assert credential(first_a)["data"]["username"] != credential(first_b)["data"]["username"]
        assert files(first_a)["tls.key"] != files(first_b)["tls.key"]
        # Then each keeps its own, at its own polls.
        again_a, again_b = await asyncio.gather(polls.poll(objects, a), polls.poll(objects, b))
        assert files(again_a) == files(first_a) and files(again_b) == files(first_b)
        # A third pod, after the ref is known to carry a lifetime: its own from the start.
        third = await polls.poll(objects, polls.pod("uid-c"))
        users = {credential(r)["data"]["username"] for r in (first_a, first_b, third)}
        assert len(users) == 3
    finally:
        await polls.backends.close()


@pytest.mark.parametrize(("role", "revoked"), [("dyn", True), ("dyn-no-revoke", False)])
async def test_a_pod_that_stops_polling_has_its_leases_revoked(
    engines: OpenBao,
    signing_key: SigningKey,
    tmp_path: Path,
    postgres: PostgreSQL,
    role: str,
    revoked: bool,
) -> None:
    polls = Polls(engines, signing_key, tmp_path, lease_idle_after=2.0)
    try:
        objects = CREDS.format(role="long")
        pod = polls.pod()
        answer = credential(await polls.poll(objects, pod, role=role))
        await polls.poll(objects, pod, role=role)
        user = answer["data"]["username"]
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and "idle" not in polls.events():
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.5)  # the revocation runs in the background
        events = polls.events()
        assert events.get("idle") == 1.0
        lease = polls.openbao.lease_lookup(answer["lease_id"])
        if revoked:
            assert events.get("revoked") == 1.0
            assert lease is None and user not in postgres.roles()
        else:  # the policy grants no sys/leases/revoke: counted, and left to its TTL
            assert events.get("revoke_refused") == 1.0
            assert lease is not None and user in postgres.roles()
        # The pod is gone from the table: a poll now is a new credential.
        again = credential(await polls.poll(objects, pod, role=role))
        assert again["data"]["username"] != user
    finally:
        await polls.backends.close()
