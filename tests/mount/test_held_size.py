"""What the held-credentials table counts for an entry is what the entry keeps alive (issue 40,
item 2): its contents, the parsed data kept beside them, and the entry itself — measured here
with tracemalloc. (A parsed answer of many small JSON values costs several times its JSON: the
old count, the contents alone, let a tenant's 4 MB dynamic secrets hold 35 MB each.)"""

from __future__ import annotations

import gc
import json
import tracemalloc

import pytest

from provider.core.model import SecretValue
from provider.mount.lifetimes import ENTRY_OVERHEAD, kept_size


def traced(content: bytes, parse: bool) -> tuple[SecretValue, int]:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        copy = bytes(bytearray(content))  # the value's own bytes, allocated while traced
        value = SecretValue(content=copy, data=json.loads(copy) if parse else None)
        gc.collect()
        return value, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    "data",
    [
        {f"k{i:06d}": "v" * 16 for i in range(30_000)},  # many small values
        {f"k{i}": "v" * 65536 for i in range(16)},  # a few long strings
        [[i, str(i), {"n": i / 3}] for i in range(10_000)],  # nested lists and maps
    ],
    ids=["keys", "strings", "nested"],
)
def test_an_entry_counts_its_parsed_data_as_tracemalloc_measures_it(data: object) -> None:
    content = json.dumps(data).encode()
    value, measured = traced(content, parse=True)
    counted = kept_size([value]) - ENTRY_OVERHEAD
    assert 0.9 * measured <= counted <= 1.2 * measured, (counted, measured, len(content))
    if isinstance(data, dict) and len(data) > 1000:
        assert counted > 3 * len(content)  # what the old count (the contents) missed


def test_an_entry_without_parsed_data_counts_its_contents() -> None:
    content = b"x" * 100_000
    value, measured = traced(content, parse=False)
    counted = kept_size([value]) - ENTRY_OVERHEAD
    assert 0.9 * measured <= counted <= 1.2 * measured
