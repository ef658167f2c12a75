"""What makes a Vault answer a credential with a lifetime (backends/vault/leases.py), for the
answers a tenant's own Vault may give: only a lease_id with a positive duration, or a
certificate, counts; malformed fields count as absent, never as an error."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from backends.vault.dialect import TLSConfig, VaultStore
from backends.vault.leases import TokenLife, lifetime_of
from devkit import certs

STORE = VaultStore("https://vault", "", "app", "jwt", "vault", TLSConfig())
LIFE = TokenLife(ttl=60.0, end=1000.0 + 60.0, renewable=True)
NOW = 1000.0


def life(payload: dict[str, Any]) -> Any:
    return lifetime_of(payload, STORE, "token", LIFE, NOW)


def test_a_lease_ends_with_its_token_when_that_is_sooner() -> None:
    found = life({"lease_id": "database/creds/app/x", "lease_duration": 300, "renewable": True})
    assert found is not None and found.kind == "lease" and found.renewable
    assert found.end == NOW + 60.0  # the token's end, not the lease's 300 s
    assert "lease_duration 300s" in found.why and "database/creds" not in found.why


@pytest.mark.parametrize(
    "payload",
    [
        {"lease_id": "", "lease_duration": 2764800, "data": {"k": "v"}},  # KV v1's refresh hint
        {"lease_id": "a/b", "lease_duration": 0},
        {"lease_id": "a/b", "lease_duration": -5},
        {"lease_id": "a/b", "lease_duration": "300"},
        {"lease_id": "a/b", "lease_duration": True},
        {"lease_id": ["a"], "lease_duration": 300},
        {"data": {"certificate": "not a certificate"}},
        {"data": {"certificate": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----"}},
        {"data": {"certificate": "\ud800"}},
        {"data": {"certificate": 5, "expiration": 99999999999}},
        {"data": "x"},
    ],
)
def test_malformed_or_plain_answers_have_no_lifetime(payload: dict[str, Any]) -> None:
    assert life(payload) is None


def test_a_certificate_ends_at_its_expiration_or_not_after() -> None:
    expires = time.time() + 600
    by_field = life({"data": {"certificate": "PEM", "expiration": expires}})
    assert by_field is not None and by_field.kind == "certificate" and not by_field.renewable
    assert by_field.end == pytest.approx(NOW + 600, abs=2)
    issued = certs.issue("app.example.test", certs.issue("ca", ca=True))
    by_pem = life({"data": {"certificate": issued.pem.decode()}})
    assert by_pem is not None and by_pem.kind == "certificate"
    assert by_pem.end > NOW and not math.isinf(by_pem.end)
