"""The default run's copy of the revoked-credential soak (test_vault_lifetimes.py's
`test_no_poll_answers_a_revoked_credential_under_a_20s_40s_token`, marker `bench`), with time
scaled down by about three: a login token of 6 s TTL and 12 s max TTL polled every second for
36 s — three token lives, twelve polls each, as the soak's 40 s tokens polled every 3 s for
120 s. Same assertions: no poll ever answers a credential OpenBao revoked."""

from __future__ import annotations

import asyncio
import time

import pytest

from devkit.openbao import OpenBao
from devkit.postgres import PostgreSQL
from tests.backends.vault.test_vault_lifetimes import (  # the module's fixtures, reused
    CREDS,
    Polls,
    credential,
    engines,  # noqa: F401
    polls,  # noqa: F401
    postgres,  # noqa: F401
)

ROLE = "dyn-scaled-token"


@pytest.fixture(scope="module")
def scaled_role(engines: OpenBao) -> str:  # noqa: F811
    engines.root().write(
        f"auth/jwt/role/{ROLE}",
        role_type="jwt",
        bound_audiences=["vault"],
        user_claim="sub",
        bound_subject="system:serviceaccount:default:app",
        token_policies=["dyn"],
        token_ttl="6s",
        token_max_ttl="12s",
    )
    return ROLE


@pytest.mark.timeout(120)
async def test_no_poll_answers_a_revoked_credential_under_a_6s_12s_token(
    polls: Polls,  # noqa: F811
    postgres: PostgreSQL,  # noqa: F811
    scaled_role: str,
) -> None:
    objects = CREDS.format(role="long")
    pod = polls.pod()
    seen: list[str] = []
    start = time.monotonic()
    while time.monotonic() - start < 36.0:
        answer = credential(await polls.poll(objects, pod, role=scaled_role))
        user, password = answer["data"]["username"], answer["data"]["password"]
        assert polls.openbao.lease_lookup(answer["lease_id"]) is not None, "lease revoked"
        assert postgres.can_login(user, password), f"user dropped at {time.monotonic() - start}"
        if not seen or seen[-1] != user:
            seen.append(user)
        await asyncio.sleep(1.0)
    # About one credential per login token (each lives at most 12 s), re-issued before it ends.
    assert 3 <= len(seen) <= 6, seen
    assert polls.events().get("renewed", 0) >= 2  # the token was renewed (renew-self) between
