"""Google answers are charged to the mount's answer budget and the bytes in flight (issue 40,
item 1), against the Secret Manager wire fake: past the budget the fetch is refused with the
budget's message, objects and selections alike, and every byte is given back."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from backends.gcp.selection import selection
from backends.gcp.store import create
from devkit.testing import fetch_ctx
from provider.core.errors import LimitExceeded
from provider.core.limits import ANSWER_SLACK, ReadBytes
from provider.core.parsing import Problems
from tests.backends.gcp.conftest import Stack

BUDGET = 100_000
KSA = "ksa:default/app"


@pytest.mark.parametrize("shape", ["objects", "selection"])
async def test_gcp_reads_past_the_answer_budget_refuse_the_fetch(stack: Stack, shape: str) -> None:
    names = [f"projects/proj/secrets/big{shape}{i}" for i in range(10)]
    for name in names:
        stack.google.add_secret(name, "x" * 40_000, KSA)
    stack.google.viewers["projects/proj"] = {KSA}  # a selector lists the project
    pool = ReadBytes(1 << 30, 1 << 30, BUDGET + ANSWER_SLACK)
    env = dataclasses.replace(stack.env, reads=pool)
    backend = create(env)
    lines = [f"- resourceName: {n}/versions/latest\n  path: f{i}" for i, n in enumerate(names)]
    plan = stack.plan({"secrets": "\n".join(lines)})
    refs: list[Any] = list(dict.fromkeys(spec.ref for spec in plan.objects))
    if shape == "selection":
        entry = {"project": "proj", "namePrefix": f"big{shape}", "directory": "d"}
        refs = [selection(entry, plan.store, 100, "select[0]", Problems())]
    identity = await backend.identify(plan, stack.pod())
    try:
        with pytest.raises(LimitExceeded, match=r"\(--max-response-bytes\)"):
            await backend.fetch(plan, identity, refs, fetch_ctx(6))
    finally:
        await backend.close()
    assert pool.in_use == 0
