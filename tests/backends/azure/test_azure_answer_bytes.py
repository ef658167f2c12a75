"""Key Vault answers are charged to the mount's answer budget and the bytes in flight as their
bodies are read (issue 40, item 1), against the Key Vault wire fake: past the budget the fetch is
refused with the budget's message, and every byte is given back."""

from __future__ import annotations

import dataclasses

import pytest

from backends.azure.store import create
from devkit.testing import make_env
from provider.core.errors import LimitExceeded
from provider.core.limits import ANSWER_SLACK, ReadBytes
from tests.backends.azure.conftest import TENANT, Azure
from tests.backends.azure.test_azure_fetch import CLIENT, fetch, objects, plan

BUDGET = 100_000


async def test_azure_reads_past_the_answer_budget_refuse_the_fetch(azure: Azure) -> None:
    # A vault of its own: the fake is shared, and another module's test puts kv1 in another
    # tenant (which of them runs first on a worker depends on the distribution).
    vault = azure.fake.vault("kv-bytes", TENANT)
    vault.access[CLIENT] = "*"
    for i in range(10):
        vault.add("secret", f"big{i}", {"value": "x" * 20_000})
    pool = ReadBytes(1 << 30, 1 << 30, BUDGET + ANSWER_SLACK)
    backend = create(dataclasses.replace(make_env("azure", azure.options), reads=pool))
    p = plan(
        objects(*(f"objectName: big{i}\nobjectType: secret" for i in range(10))),
        keyvaultName="kv-bytes",
    )
    try:
        with pytest.raises(LimitExceeded, match=r"\(--max-response-bytes\)"):
            await fetch(backend, p)
    finally:
        await backend.close()
    assert pool.in_use == 0
